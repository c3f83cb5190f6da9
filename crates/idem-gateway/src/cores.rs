//! Serving on one single-threaded runtime per core ([`Runtime::PerCore`](crate::Runtime::PerCore)).
//!
//! # Why
//!
//! On tokio's work-stealing runtime a forwarded request often crosses
//! threads: the client's connection is polled on one worker, the upstream
//! connection's task on another, and each hand-over wakes a thread. For a
//! proxy that does little work per request those wake-ups cost more than the
//! work. Here each of N threads runs a current-thread runtime with its own
//! listening socket, its own accept loop and its own pool of upstream
//! connections, so a request is read, forwarded and answered on the thread
//! that accepted its connection.
//!
//! # One socket per runtime
//!
//! Each runtime accepts on a socket of its own bound to the same address
//! with `SO_REUSEPORT`, and the kernel spreads new connections evenly over
//! them. The kernel allows that only when the caller's listener was bound
//! with `SO_REUSEPORT` too ([`bind_per_core`] binds one so) and only for the
//! same user. When the caller's listener does not allow it (one bound by
//! [`TcpListener::bind`], or a platform without `SO_REUSEPORT`), every
//! runtime accepts on a duplicate of the caller's socket instead: that is
//! sound (an accepted connection goes to exactly one runtime; the others
//! find nothing to accept), but the runtime that wakes first takes a burst
//! of connections, so the load spreads less evenly.
//!
//! # What stays shared
//!
//! The layer, its store and its background tasks (the sweeper, the spool,
//! the waiters' notices) stay on the caller's runtime and are used from
//! every serving runtime: a store answers over channels (SQLite's writer
//! thread) or over sockets registered with the runtime that opened them. A
//! pooled database connection (PostgreSQL) opened while a serving runtime
//! asked for it belongs to that runtime's reactor; it serves the others too
//! while that runtime runs, and fails when it has stopped, after `run`
//! returns, when the pool tests it before handing it out and opens a new
//! one. A Redis connection the client reopens (after the server closed
//! it) while a request on a serving runtime was using it is driven by that
//! runtime in the same way: every runtime's commands go through it while
//! it runs; after `run` returns, the first command on it fails and the
//! client opens a new one. The limit of requests in flight is one for all
//! runtimes.
//!
//! # Shutdown
//!
//! The shutdown future is awaited on the caller's runtime; it then tells
//! every runtime to stop accepting. Each drains its own requests within the
//! grace period, its runtime is dropped (abandoning what still runs), and
//! `run` returns when every thread has finished. Dropping `run`'s future
//! stops every runtime at once, without draining. A serving thread that
//! ends before the shutdown (its accept loop panicked; a request's panic
//! ends only its connection's task) stops the others the same way, and `run`
//! returns its error.

use std::future::Future;
use std::net::SocketAddr;
use std::num::NonZeroUsize;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};

use super::Serving;
use idem_http::WaitableStore;

/// A listener for [`Runtime::PerCore`](crate::Runtime::PerCore) on `addr`: bound with `SO_REUSEPORT`
/// (and `SO_REUSEADDR`), so each serving runtime can bind a socket of its own
/// to the same address. Fails, as a plain bind would, when something
/// already listens there, so a second gateway started on the same port by
/// mistake does not quietly take a share of the connections. Where
/// `SO_REUSEPORT` does not exist it is a plain [`TcpListener::bind`].
pub async fn bind_per_core(addr: SocketAddr) -> std::io::Result<TcpListener> {
    #[cfg(all(
        unix,
        not(any(target_os = "solaris", target_os = "illumos", target_os = "cygwin"))
    ))]
    {
        // A plain bind conflicts with any listener on the address, whether
        // or not it allows reuse: the check that nothing is there.
        let probe = std::net::TcpListener::bind(addr)?;
        let addr = probe.local_addr()?;
        drop(probe);
        let listener = reusable_socket(addr)?.listen(BACKLOG)?;
        Ok(listener)
    }
    #[cfg(not(all(
        unix,
        not(any(target_os = "solaris", target_os = "illumos", target_os = "cygwin"))
    )))]
    {
        TcpListener::bind(addr).await
    }
}

/// The backlog of each listening socket (tokio's own default).
const BACKLOG: u32 = 1024;

/// A socket bound to `addr` with `SO_REUSEADDR` and `SO_REUSEPORT`, not yet
/// listening.
#[cfg(all(
    unix,
    not(any(target_os = "solaris", target_os = "illumos", target_os = "cygwin"))
))]
fn reusable_socket(addr: SocketAddr) -> std::io::Result<tokio::net::TcpSocket> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

/// Another listening socket on `addr`, in the caller's `SO_REUSEPORT` group;
/// refused by the kernel when the caller's socket is not in one.
#[cfg(all(
    unix,
    not(any(target_os = "solaris", target_os = "illumos", target_os = "cygwin"))
))]
fn sibling(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    reusable_socket(addr)?.listen(BACKLOG)?.into_std()
}

#[cfg(not(all(
    unix,
    not(any(target_os = "solaris", target_os = "illumos", target_os = "cygwin"))
)))]
fn sibling(_addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// The caller's listener and `workers - 1` more on its address: sockets of
/// their own when the caller's allows `SO_REUSEPORT`, else duplicates of it.
fn listeners(
    listener: TcpListener,
    workers: NonZeroUsize,
) -> std::io::Result<Vec<std::net::TcpListener>> {
    let addr = listener.local_addr()?;
    let first = listener.into_std()?;
    let mut all = Vec::with_capacity(workers.get());
    for _ in 1..workers.get() {
        match sibling(addr) {
            Ok(own) => all.push(own),
            Err(error) if all.is_empty() => {
                tracing::debug!(
                    %error,
                    "the listener does not allow SO_REUSEPORT; every runtime accepts on a duplicate of it"
                );
                for _ in 1..workers.get() {
                    all.push(first.try_clone()?);
                }
                break;
            }
            Err(error) => return Err(error),
        }
    }
    all.insert(0, first);
    Ok(all)
}

/// Serves `serving` on `workers` threads, each with a current-thread
/// runtime and a listener of its own, until `shutdown`; then drains every
/// one and returns whether all drained within the grace period. A thread
/// that ends before the shutdown (its accept loop panicked) stops them all:
/// the others drain, and this returns the error, so the process exits and
/// its supervisor starts it again rather than serving on fewer cores.
pub(crate) async fn serve<St>(
    listener: TcpListener,
    serving: Serving<St>,
    workers: NonZeroUsize,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<bool>
where
    St: WaitableStore + 'static,
{
    // `true` once the shutdown came; dropping the sender (when `run`'s
    // future is dropped) stops every runtime at once.
    let (stop, stopping) = watch::channel(false);
    let (report, finished) = mpsc::unbounded_channel();
    let mut threads = 0;
    for (index, listener) in listeners(listener, workers)?.into_iter().enumerate() {
        let (ready, started) = oneshot::channel();
        let serving = serving.clone();
        let stopping = stopping.clone();
        spawn_serving(index, report.clone(), move || {
            serve_on_own_runtime(listener, serving, stopping, ready)
        })?;
        started
            .await
            .map_err(|_| std::io::Error::other("a serving thread ended as it started"))??;
        threads += 1;
    }
    tracing::debug!(runtimes = threads, "serving on one runtime per core");
    // Each thread holds a sender until it has reported: the channel closes
    // once every one has.
    drop(report);
    supervise(finished, stop, shutdown).await
}

/// How a serving thread ended: whether it drained within the grace period,
/// or what it panicked with.
type Ended = (usize, Result<bool, String>);

/// Starts thread `idem-serve-{index}` running `body`, and reports how it
/// ended on `report`, a panic included.
fn spawn_serving(
    index: usize,
    report: mpsc::UnboundedSender<Ended>,
    body: impl FnOnce() -> bool + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(format!("idem-serve-{index}"))
        .spawn(move || {
            let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body))
                .map_err(|panic| panic_message(panic.as_ref()));
            report.send((index, ended)).ok();
        })?;
    Ok(())
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// Waits for `shutdown`, or for one of the serving threads reporting on
/// `finished` to end before it; then tells every thread to stop and waits
/// for each to report. Returns whether all drained, or the error of the
/// first thread that ended early.
async fn supervise(
    mut finished: mpsc::UnboundedReceiver<Ended>,
    stop: watch::Sender<bool>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<bool> {
    let early = tokio::select! {
        () = shutdown => None,
        ended = finished.recv() => ended,
    };
    let failure = early.as_ref().map(|(index, ended)| {
        let why = match ended {
            Err(message) => format!("panicked: {message}"),
            Ok(_) => "stopped accepting".to_owned(),
        };
        let failure = format!(
            "serving thread idem-serve-{index} {why}; every runtime was stopped, so restart the gateway"
        );
        tracing::error!("{failure}");
        failure
    });
    stop.send_replace(true);
    let mut drained = true;
    while let Some((index, ended)) = finished.recv().await {
        match ended {
            Ok(done) => drained &= done,
            Err(message) => {
                tracing::error!("serving thread idem-serve-{index} panicked: {message}");
                drained = false;
            }
        }
    }
    match failure {
        Some(failure) => Err(std::io::Error::other(failure)),
        None => Ok(drained),
    }
}

/// One serving thread: a current-thread runtime that serves `listener`
/// until told to stop, drains, and is dropped (abandoning whatever still
/// runs after the grace period) before this returns.
fn serve_on_own_runtime<St>(
    listener: std::net::TcpListener,
    serving: Serving<St>,
    mut stopping: watch::Receiver<bool>,
    ready: oneshot::Sender<std::io::Result<()>>,
) -> bool
where
    St: WaitableStore + 'static,
{
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            ready.send(Err(error)).ok();
            return false;
        }
    };
    let drained = runtime.block_on(async move {
        let listener = match TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(error) => {
                ready.send(Err(error)).ok();
                return false;
            }
        };
        ready.send(Ok(())).ok();
        let mut aborting = stopping.clone();
        let draining = async move {
            // Ends on the shutdown, and when the sender is gone.
            stopping.wait_for(|stop| *stop).await.ok();
        };
        let aborted = async move {
            // Only a dropped sender ends this: `run` was dropped.
            while aborting.changed().await.is_ok() {}
        };
        tokio::select! {
            drained = serving.serve(listener, draining) => drained,
            () = aborted => false,
        }
    });
    drop(runtime);
    drained
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn per_core_listeners_share_the_address_and_refuse_a_second_gateway() {
        let listener = bind_per_core("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        assert!(bind_per_core(addr).await.is_err());
        let all = listeners(listener, NonZeroUsize::new(3).unwrap()).unwrap();
        assert_eq!(all.len(), 3);
        for listener in &all {
            assert_eq!(listener.local_addr().unwrap(), addr);
        }
    }

    #[tokio::test]
    async fn a_thread_that_panics_stops_every_thread_and_is_reported() {
        let (stop, stopping) = watch::channel(false);
        let (report, finished) = mpsc::unbounded_channel();
        let told = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = told.clone();
        let mut waiting = stopping.clone();
        spawn_serving(0, report.clone(), move || {
            // Serves until told to stop, as an accept loop does.
            let told_to_stop = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap()
                .block_on(async move { waiting.wait_for(|stop| *stop).await.is_ok() });
            seen.store(told_to_stop, std::sync::atomic::Ordering::SeqCst);
            true
        })
        .unwrap();
        spawn_serving(1, report, || panic!("the accept loop broke")).unwrap();
        let error = supervise(finished, stop, std::future::pending())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("idem-serve-1 panicked: the accept loop broke"),
            "{error}"
        );
        assert!(told.load(std::sync::atomic::Ordering::SeqCst));
        drop(stopping);
    }

    #[tokio::test]
    async fn after_the_shutdown_every_thread_drains_and_reports() {
        let (stop, stopping) = watch::channel(false);
        let (report, finished) = mpsc::unbounded_channel();
        for index in 0..3 {
            let mut waiting = stopping.clone();
            spawn_serving(index, report.clone(), move || {
                tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap()
                    .block_on(async move { waiting.wait_for(|stop| *stop).await.is_ok() })
                    && index != 2
            })
            .unwrap();
        }
        drop(report);
        // Thread 2 did not drain within its grace period.
        let drained = supervise(finished, stop, async {}).await.unwrap();
        assert!(!drained);
    }

    #[tokio::test]
    async fn a_plain_listener_is_duplicated() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let all = listeners(listener, NonZeroUsize::new(2).unwrap()).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].local_addr().unwrap(), addr);
    }
}
