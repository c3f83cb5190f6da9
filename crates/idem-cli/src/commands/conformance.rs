//! `idem conformance`: `idem-proof`'s tester for any Idempotency-Key
//! server. Exits 1 when a required rule fails.

pub(crate) use idem_proof::ConformanceArgs;

pub(crate) async fn run(args: &ConformanceArgs) -> anyhow::Result<()> {
    idem_proof::conformance(args).await
}
