//! `idem torture` (feature `lab`): `idem-proof`'s fault campaign over the
//! real local stack. Its trials start `idem serve`, `idem relay`, `idem
//! forward` and `idem dup-proxy` as child processes of this binary.

pub(crate) use idem_proof::TortureArgs;

pub(crate) async fn run(args: &TortureArgs) -> anyhow::Result<()> {
    idem_proof::torture(args).await
}
