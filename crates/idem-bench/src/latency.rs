//! A TCP relay that adds a fixed one-way delay to every byte in each
//! direction: `idem bench consume --db-latency` puts it between the benchmark
//! and PostgreSQL, so a loopback database behaves like one across a network,
//! where each round trip costs time rather than only CPU.
//!
//! It runs on OS threads, not on the async runtime: tokio's timer rounds every
//! sleep up to whole milliseconds, too coarse for the sub-millisecond delays
//! of a network inside one data centre, while `std::thread::sleep` wakes within
//! tens of microseconds. Each direction of each connection has a reader, which
//! stamps every chunk with the time it is due, and a writer, which sends the
//! chunks in order once they are due; bytes are never reordered or merged
//! across their due times.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// A listening relay; connections to [`LatencyLink::local_addr`] reach the
/// upstream address with the delay added each way. It lives as long as the
/// process (the benchmark's run).
#[derive(Debug)]
pub struct LatencyLink {
    local: SocketAddr,
    delays: Arc<Delays>,
}

/// What the writers measured: how long each chunk took from being read to
/// being written, which is the configured delay plus however late the
/// writer woke up.
#[derive(Debug, Default)]
struct Delays {
    chunks: AtomicU64,
    total_micros: AtomicU64,
}

impl LatencyLink {
    /// Listens on a free loopback port and relays every connection to
    /// `upstream` (`host:port`), delaying each direction by `one_way`.
    pub fn start(upstream: &str, one_way: Duration) -> io::Result<Self> {
        let target = upstream.to_socket_addrs()?.next().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{upstream} resolves to no address"),
            )
        })?;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let local = listener.local_addr()?;
        let delays = Arc::new(Delays::default());
        let measured = Arc::clone(&delays);
        thread::Builder::new()
            .name("latency-accept".into())
            .spawn(move || {
                for client in listener.incoming() {
                    let Ok(client) = client else { continue };
                    if let Err(error) = relay(client, target, one_way, &measured) {
                        eprintln!("warning: the latency relay could not reach {target}: {error}");
                    }
                }
            })?;
        Ok(Self { local, delays })
    }

    /// The mean delay the chunks relayed so far actually had, one way; `None`
    /// before the first.
    pub fn mean_delay(&self) -> Option<Duration> {
        let chunks = self.delays.chunks.load(Ordering::Relaxed);
        let total = self.delays.total_micros.load(Ordering::Relaxed);
        (chunks > 0).then(|| Duration::from_micros(total / chunks))
    }

    /// Where to connect instead of the upstream.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

/// Relays one accepted connection to `target`, both ways.
fn relay(
    client: TcpStream,
    target: SocketAddr,
    one_way: Duration,
    delays: &Arc<Delays>,
) -> io::Result<()> {
    let server = TcpStream::connect(target)?;
    for stream in [&client, &server] {
        stream.set_nodelay(true)?;
    }
    delay(client.try_clone()?, server.try_clone()?, one_way, delays)?;
    delay(server, client, one_way, delays)
}

/// Starts the two threads of one direction: what `from` sends reaches `to`
/// `one_way` later.
fn delay(
    from: TcpStream,
    to: TcpStream,
    one_way: Duration,
    delays: &Arc<Delays>,
) -> io::Result<()> {
    let (due, chunks) = mpsc::channel::<(Instant, Vec<u8>)>();
    let delays = Arc::clone(delays);
    let mut reading = from;
    thread::Builder::new()
        .name("latency-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match reading.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if due
                            .send((Instant::now() + one_way, buf[..n].to_vec()))
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
            // Dropping `due` ends the writer once it has sent what is queued.
        })?;
    let mut writing = to;
    thread::Builder::new()
        .name("latency-write".into())
        .spawn(move || {
            for (at, chunk) in chunks {
                let now = Instant::now();
                if at > now {
                    thread::sleep(at - now);
                }
                if writing.write_all(&chunk).is_err() {
                    break;
                }
                let took = (Instant::now() + one_way).saturating_duration_since(at);
                delays.chunks.fetch_add(1, Ordering::Relaxed);
                delays.total_micros.fetch_add(
                    u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
                    Ordering::Relaxed,
                );
            }
            let _ = writing.shutdown(Shutdown::Write);
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server behind the link: a round trip takes at least twice the
    /// one-way delay, and the bytes come back whole and in order.
    #[test]
    fn adds_the_delay_each_way_and_keeps_the_bytes() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let echo_addr = echo.local_addr().unwrap();
        thread::spawn(move || {
            let (mut conn, _) = echo.accept().unwrap();
            let mut buf = [0u8; 1024];
            loop {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => conn.write_all(&buf[..n]).unwrap(),
                }
            }
        });
        let one_way = Duration::from_millis(20);
        let link = LatencyLink::start(&echo_addr.to_string(), one_way).unwrap();
        let mut conn = TcpStream::connect(link.local_addr()).unwrap();
        let message: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        let started = Instant::now();
        conn.write_all(&message).unwrap();
        let mut back = vec![0u8; message.len()];
        conn.read_exact(&mut back).unwrap();
        assert!(started.elapsed() >= one_way * 2, "{:?}", started.elapsed());
        assert_eq!(back, message);
        let mean = link.mean_delay().expect("chunks were relayed");
        assert!(mean >= one_way, "{mean:?}");
    }
}
