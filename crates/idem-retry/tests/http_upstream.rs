//! Retries against a real HTTP server on 127.0.0.1: it answers 503 with
//! Retry-After, resets connections, answers 409 and 422, following a script.
//! Requests go through hyper-util's legacy client, wrapped by the tower policy
//! or driven by `Retrier::run`. Delays are checked two ways: the exact delays
//! the loop asked a `VirtualTimer` for, and, on tokio's paused clock, the gaps
//! the server saw between attempts. Nothing sleeps on wall time.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use idem_core::IdempotencyKey;
use idem_retry::{
    Backoff, BudgetSettings, DeadlineReached, HttpPolicy, HttpRetryError, HttpRetryLayer,
    HttpRetryPolicy, Retrier, RetryBudget, RetryConfig, StopReason, Timer, TokioTimer,
    VirtualTimer, with_idempotency_key,
};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tower::{Layer, Service, ServiceExt};

const SEED: u64 = 42;

/// What the server does with the next connection.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Answer with this status, and `Retry-After` if given.
    Answer(u16, Option<&'static str>),
    /// Read the request, then reset the connection without answering.
    Reset,
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Arrival {
    key: Option<String>,
    at: tokio::time::Instant,
}

/// A scripted upstream: one request per connection, each connection takes the
/// next step (200 once the script is used up).
struct Upstream {
    addr: SocketAddr,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
}

impl Upstream {
    async fn start(script: &[Step]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(script.iter().copied().collect::<VecDeque<_>>()));
        let seen = arrivals.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let step = script
                    .lock()
                    .unwrap()
                    .pop_front()
                    .unwrap_or(Step::Answer(200, None));
                tokio::spawn(serve_one(stream, step, seen.clone()));
            }
        });
        Self { addr, arrivals }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn arrivals(&self) -> Vec<Arrival> {
        self.arrivals.lock().unwrap().clone()
    }

    fn keys(&self) -> Vec<Option<String>> {
        self.arrivals().into_iter().map(|a| a.key).collect()
    }

    fn gaps(&self) -> Vec<Duration> {
        self.arrivals()
            .windows(2)
            .map(|pair| pair[1].at - pair[0].at)
            .collect()
    }
}

async fn serve_one(mut stream: TcpStream, step: Step, seen: Arc<Mutex<Vec<Arrival>>>) {
    match step {
        Step::Reset => {
            let head = read_request(&mut stream).await;
            seen.lock().unwrap().push(Arrival {
                key: header_in(&head, "idempotency-key"),
                at: tokio::time::Instant::now(),
            });
            // SO_LINGER 0: dropping the socket sends RST, not FIN.
            stream.set_zero_linger().unwrap();
            drop(stream);
        }
        Step::Answer(status, retry_after) => {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let seen = seen.clone();
                async move {
                    seen.lock().unwrap().push(Arrival {
                        key: request
                            .headers()
                            .get("idempotency-key")
                            .map(|v| v.to_str().unwrap().to_owned()),
                        at: tokio::time::Instant::now(),
                    });
                    let mut response = Response::builder().status(status);
                    if let Some(value) = retry_after {
                        response = response.header("retry-after", value);
                    }
                    Ok::<_, std::convert::Infallible>(
                        response.body(Full::new(Bytes::from_static(b"{}"))).unwrap(),
                    )
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        }
    }
}

/// Reads a whole HTTP/1.1 request (head and Content-Length body) as text.
async fn read_request(stream: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await.unwrap();
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf);
        if let Some(end) = text.find("\r\n\r\n") {
            let body_len: usize = header_in(&text, "content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + body_len {
                break;
            }
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

fn header_in(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|line| {
        let (field, value) = line.split_once(':')?;
        field
            .eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

fn config() -> RetryConfig {
    RetryConfig::default().with_backoff(Backoff::default().with_seed(SEED))
}

/// The jittered delays the seeded backoff draws, in order.
fn jitter() -> Vec<Duration> {
    config().backoff.delays().collect()
}

fn post(url: &str, key: &str) -> Request<Full<Bytes>> {
    let request = Request::post(url)
        .body(Full::new(Bytes::from_static(b"{\"amount\":100}")))
        .unwrap();
    with_idempotency_key(request, IdempotencyKey::new(key).unwrap())
}

fn tower_client<T: Timer + Clone>(
    budget: Arc<RetryBudget>,
    config: RetryConfig,
    timer: T,
) -> idem_retry::RetryingClient<HttpClient, HttpPolicy, T> {
    HttpRetryLayer::new(HttpRetryPolicy::new(config, budget).with_timer(timer)).layer(client())
}

async fn send<S>(
    service: &mut S,
    request: Request<Full<Bytes>>,
) -> Result<StatusCode, HttpRetryError>
where
    S: Service<Request<Full<Bytes>>, Response = Response<Incoming>, Error = HttpRetryError>,
{
    let response = service.ready().await?.call(request).await?;
    Ok(response.status())
}

#[tokio::test]
async fn tower_retries_503_and_a_reset_with_one_key_and_the_requested_delays() {
    let upstream = Upstream::start(&[Step::Answer(503, Some("2")), Step::Reset]).await;
    let timer = VirtualTimer::new();
    let mut service = tower_client(Arc::new(RetryBudget::default()), config(), timer.clone());

    // The call is an ordinary Send future: it can be spawned.
    let request = post(&upstream.url("/charges"), "order-42/charge");
    let call = async move { send(&mut service, request).await };
    let status = tokio::spawn(call).await.unwrap().unwrap();

    assert_eq!(status, StatusCode::OK);
    let quoted = Some("\"order-42/charge\"".to_owned());
    assert_eq!(upstream.keys(), [quoted.clone(), quoted.clone(), quoted]);
    // After the 503 the server's 2 s hint beats the first jitter (at most
    // 200 ms); after the reset the second jittered delay is used as drawn.
    let jitter = jitter();
    assert!(jitter[0] <= Duration::from_millis(200));
    assert_eq!(timer.slept(), [Duration::from_secs(2), jitter[1]]);
}

#[tokio::test(start_paused = true)]
async fn on_tokio_time_the_server_sees_the_gaps_the_policy_asked_for() {
    let upstream = Upstream::start(&[Step::Answer(503, Some("3")), Step::Reset]).await;
    let mut service = tower_client(Arc::new(RetryBudget::default()), config(), TokioTimer);

    let status = send(
        &mut service,
        post(&upstream.url("/charges"), "order-43/charge"),
    )
    .await
    .unwrap();

    assert_eq!(status, StatusCode::OK);
    let gaps = upstream.gaps();
    assert_eq!(gaps.len(), 2);
    // Paused time moves only to timer deadlines, which tokio keeps to whole
    // milliseconds: each gap is the asked delay, rounded up by under 1 ms.
    let asked = [Duration::from_secs(3), jitter()[1]];
    for (gap, asked) in gaps.iter().zip(asked) {
        assert!(
            *gap >= asked && *gap < asked + Duration::from_millis(2),
            "gap {gap:?}, asked {asked:?}"
        );
    }
}

#[tokio::test]
async fn a_422_is_answered_after_one_attempt() {
    let upstream = Upstream::start(&[Step::Answer(422, None)]).await;
    let timer = VirtualTimer::new();
    let mut service = tower_client(Arc::new(RetryBudget::default()), config(), timer.clone());

    let status = send(&mut service, post(&upstream.url("/charges"), "order-44"))
        .await
        .unwrap();

    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(upstream.arrivals().len(), 1);
    assert!(timer.slept().is_empty());
}

#[tokio::test]
async fn a_409_is_retried_only_with_retry_after() {
    let upstream = Upstream::start(&[Step::Answer(409, Some("1")), Step::Answer(409, None)]).await;
    let timer = VirtualTimer::new();
    let mut service = tower_client(Arc::new(RetryBudget::default()), config(), timer.clone());

    let status = send(&mut service, post(&upstream.url("/charges"), "order-45"))
        .await
        .unwrap();

    // In flight (409 + Retry-After: 1) → retried after 1 s; then a bare 409 → returned.
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(upstream.arrivals().len(), 2);
    assert_eq!(timer.slept(), [Duration::from_secs(1)]);
}

#[tokio::test]
async fn attempts_run_out_and_the_last_answer_is_returned() {
    let script = [Step::Answer(503, None); 10];
    let upstream = Upstream::start(&script).await;
    let timer = VirtualTimer::new();
    let mut service = tower_client(Arc::new(RetryBudget::default()), config(), timer.clone());

    let status = send(&mut service, post(&upstream.url("/charges"), "order-46"))
        .await
        .unwrap();

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(upstream.arrivals().len(), 6, "the default 6 attempts");
    assert_eq!(timer.slept(), jitter());
}

#[tokio::test]
async fn a_post_without_a_key_is_sent_once_but_a_get_is_retried() {
    let upstream = Upstream::start(&[Step::Answer(503, None), Step::Answer(503, None)]).await;
    let mut service = tower_client(
        Arc::new(RetryBudget::default()),
        config(),
        VirtualTimer::new(),
    );

    let keyless_post = Request::post(upstream.url("/charges"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let status = send(&mut service, keyless_post).await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(upstream.arrivals().len(), 1);

    let get = Request::builder()
        .method(Method::GET)
        .uri(upstream.url("/charges/1"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let status = send(&mut service, get).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(upstream.keys(), [None, None, None]);
}

fn keyless(method: Method, url: String) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(url)
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

#[tokio::test]
async fn put_and_delete_without_a_key_are_sent_once_whatever_the_rfc_says() {
    let upstream = Upstream::start(&[Step::Answer(503, None), Step::Answer(503, None)]).await;
    let mut service = tower_client(
        Arc::new(RetryBudget::default()),
        config(),
        VirtualTimer::new(),
    );

    let put = keyless(Method::PUT, upstream.url("/users/7"));
    assert_eq!(
        send(&mut service, put).await.unwrap(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    let delete = keyless(Method::DELETE, upstream.url("/orders/latest"));
    assert_eq!(
        send(&mut service, delete).await.unwrap(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(upstream.arrivals().len(), 2, "one attempt each");
}

#[tokio::test]
async fn a_put_with_a_key_is_retried_with_that_key() {
    let upstream = Upstream::start(&[Step::Answer(503, None)]).await;
    let mut service = tower_client(
        Arc::new(RetryBudget::default()),
        config(),
        VirtualTimer::new(),
    );
    let put = with_idempotency_key(
        keyless(Method::PUT, upstream.url("/users/7")),
        IdempotencyKey::new("user-7/rename").unwrap(),
    );
    assert_eq!(send(&mut service, put).await.unwrap(), StatusCode::OK);
    assert_eq!(
        upstream.keys(),
        [
            Some("\"user-7/rename\"".to_owned()),
            Some("\"user-7/rename\"".to_owned())
        ]
    );
}

#[tokio::test]
async fn a_route_the_caller_names_idempotent_is_retried_without_a_key() {
    let upstream = Upstream::start(&[Step::Answer(503, None), Step::Answer(503, None)]).await;
    let policy = HttpRetryPolicy::new(config(), Arc::new(RetryBudget::default()))
        .with_timer(VirtualTimer::new())
        .resend_without_key(Method::PUT, "/users/{id}/avatar");
    let mut service = HttpRetryLayer::new(policy).layer(client());

    let other_route = keyless(Method::PUT, upstream.url("/users/7"));
    assert_eq!(
        send(&mut service, other_route).await.unwrap(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        upstream.arrivals().len(),
        1,
        "a route nobody named is sent once"
    );
    let named = keyless(Method::PUT, upstream.url("/users/7/avatar"));
    assert_eq!(send(&mut service, named).await.unwrap(), StatusCode::OK);
    assert_eq!(
        upstream.arrivals().len(),
        3,
        "the named route met a 503 and was resent"
    );
}

#[tokio::test]
async fn a_hint_past_the_deadline_fails_at_once_with_both_figures() {
    let upstream = Upstream::start(&[Step::Answer(503, Some("120"))]).await;
    let timer = VirtualTimer::new();
    let config = config().with_deadline(Duration::from_secs(10));
    let mut service = tower_client(Arc::new(RetryBudget::default()), config, timer.clone());

    let error = send(&mut service, post(&upstream.url("/charges"), "order-47"))
        .await
        .unwrap_err();

    match &error {
        HttpRetryError::Stopped {
            reason: StopReason::Deadline(DeadlineReached::HintBeyondDeadline { hint, remaining }),
            attempts: 1,
            last_status: Some(StatusCode::SERVICE_UNAVAILABLE),
            ..
        } => {
            assert_eq!(*hint, Duration::from_secs(120));
            assert!(*remaining <= Duration::from_secs(10) && *remaining > Duration::from_secs(9));
        }
        other => panic!("unexpected {other:?}"),
    }
    let text = error.to_string();
    assert!(text.contains("120s") && text.contains("deadline"), "{text}");
    assert_eq!(upstream.arrivals().len(), 1);
    assert!(timer.slept().is_empty(), "no sleeping past the deadline");
}

#[tokio::test]
async fn an_exhausted_budget_fails_fast_with_a_typed_error() {
    let upstream = Upstream::start(&[Step::Answer(503, None), Step::Answer(503, None)]).await;
    let none = BudgetSettings {
        retry_ratio: 0.0,
        min_retries_per_second: 0,
        ..BudgetSettings::default()
    };
    let budget = Arc::new(RetryBudget::new(none).unwrap());
    let timer = VirtualTimer::new();
    let mut service = tower_client(budget, config(), timer.clone());

    let error = send(&mut service, post(&upstream.url("/charges"), "order-48"))
        .await
        .unwrap_err();

    assert!(matches!(
        error,
        HttpRetryError::Stopped {
            reason: StopReason::BudgetExhausted(_),
            attempts: 1,
            last_status: Some(StatusCode::SERVICE_UNAVAILABLE),
            ..
        }
    ));
    assert_eq!(upstream.arrivals().len(), 1);
    assert!(timer.slept().is_empty());
}

#[tokio::test]
async fn connection_refused_is_retried_until_the_attempts_run_out() {
    // Bind a port, then close it: connecting there is refused.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let timer = VirtualTimer::new();
    let mut service = tower_client(Arc::new(RetryBudget::default()), config(), timer.clone());

    let error = send(&mut service, post(&format!("http://{addr}/"), "order-49"))
        .await
        .unwrap_err();

    assert!(matches!(error, HttpRetryError::Transport(_)), "{error:?}");
    assert_eq!(timer.slept().len(), 5, "six attempts, five waits");
}

#[tokio::test]
async fn the_retrier_drives_the_client_directly_with_the_same_key() {
    let upstream = Upstream::start(&[Step::Reset, Step::Answer(429, Some("1"))]).await;
    let client = client();
    let timer = VirtualTimer::new();
    let retrier = Retrier::new(
        config(),
        Arc::new(RetryBudget::default()),
        HttpPolicy::new(),
    )
    .with_timer(timer.clone());
    let url = upstream.url("/charges");
    let (client, url) = (&client, url.as_str());

    let key = IdempotencyKey::new("order-50/charge").unwrap();
    let response = retrier
        .run(key, |key: IdempotencyKey, _attempt| async move {
            let request = Request::post(url)
                .header(
                    idem_retry::IDEMPOTENCY_KEY,
                    idem_retry::key_header_value(&key),
                )
                .body(Full::new(Bytes::new()))
                .unwrap();
            client.request(request).await
        })
        .await
        .expect("retryable outcomes were retried")
        .expect("the last attempt got a response");

    assert_eq!(response.status(), StatusCode::OK);
    let quoted = Some("\"order-50/charge\"".to_owned());
    assert_eq!(upstream.keys(), [quoted.clone(), quoted.clone(), quoted]);
    let jitter = jitter();
    assert_eq!(
        timer.slept(),
        [jitter[0], jitter[1].max(Duration::from_secs(1))]
    );
}
