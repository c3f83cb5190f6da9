//! The payments service on a real socket: one debit per key, however many
//! times it is sent.

use std::sync::Arc;

use idem::IdempotencyKey;
use idem_grpc::GrpcRetry;
use idem_retry::{RetryBudget, RetryConfig};
use payments_grpc::DEMO_ACCOUNT;
use payments_grpc::proto::payments_client::PaymentsClient;
use payments_grpc::proto::{BalanceRequest, PayRequest};
use tonic::Code;
use tonic::transport::Channel;

async fn start() -> (tempfile::TempDir, PaymentsClient<Channel>) {
    let dir = tempfile::tempdir().unwrap();
    let service = payments_grpc::service(dir.path().join("payments.db"))
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(payments_grpc::run(
        listener,
        service,
        std::future::pending(),
    ));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    (dir, PaymentsClient::new(channel))
}

async fn balance(client: &mut PaymentsClient<Channel>) -> i64 {
    client
        .balance(BalanceRequest {
            account: DEMO_ACCOUNT.0.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .balance
}

fn pay(key: &str, amount: i64) -> tonic::Request<PayRequest> {
    let mut request = tonic::Request::new(PayRequest {
        account: DEMO_ACCOUNT.0.into(),
        amount,
    });
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_sent_three_times_debits_once() {
    let (_dir, mut client) = start().await;
    let retry = GrpcRetry::new(RetryConfig::default(), Arc::new(RetryBudget::default()));
    let mut payments = Vec::new();
    for _ in 0..3 {
        let reply = retry
            .call(
                IdempotencyKey::new("order-42").unwrap(),
                PayRequest {
                    account: DEMO_ACCOUNT.0.into(),
                    amount: 250,
                },
                |request| {
                    let mut client = client.clone();
                    async move { client.pay(request).await }
                },
            )
            .await
            .unwrap();
        payments.push(reply.into_inner());
    }
    assert!(payments.iter().all(|p| *p == payments[0]));
    assert_eq!(payments[0].balance, DEMO_ACCOUNT.1 - 250);
    assert_eq!(balance(&mut client).await, DEMO_ACCOUNT.1 - 250);
    let listed = client
        .list_payments(BalanceRequest {
            account: DEMO_ACCOUNT.0.into(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut listed = listed;
    let mut count = 0;
    while listed.message().await.unwrap().is_some() {
        count += 1;
    }
    assert_eq!(count, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_final_and_nothing_is_debited() {
    let (_dir, mut client) = start().await;
    let short = client.pay(pay("order-43", 1_000_000)).await.unwrap_err();
    assert_eq!(short.code(), Code::FailedPrecondition);
    let again = client.pay(pay("order-43", 1_000_000)).await.unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition);
    assert_eq!(again.metadata().get("idempotent-replayed").unwrap(), "true");

    let mut keyless = tonic::Request::new(PayRequest {
        account: DEMO_ACCOUNT.0.into(),
        amount: 5,
    });
    keyless.metadata_mut().remove("idempotency-key");
    let missing = client.pay(keyless).await.unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument);

    client.pay(pay("order-44", 100)).await.unwrap();
    let reused = client.pay(pay("order-44", 101)).await.unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition);
    assert_eq!(balance(&mut client).await, DEMO_ACCOUNT.1 - 100);
}
