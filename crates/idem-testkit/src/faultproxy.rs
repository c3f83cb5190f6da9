//! A TCP fault proxy for tests: listens on a loopback port, forwards every
//! connection to a loopback target, and can be switched at run time to add
//! latency, drop every connection, or hold every byte as a partition would.
//!
//! Put it between a client and a real server (a broker, a database) to cut
//! that client's connections without touching the server, which other tests
//! share.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use idem_testkit::faultproxy::{FaultProxy, Mode};
//!
//! let proxy = FaultProxy::start("127.0.0.1:5672".parse().unwrap()).await?;
//! // connect the client under test to proxy.addr() ...
//! proxy.set(Mode::Drop); // every connection closed, new ones refused
//! proxy.set(Mode::Pass); // the server is reachable again
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward every byte at once.
    Pass,
    /// Forward every chunk after this delay.
    Delay(Duration),
    /// Close every connection and refuse new ones (accept, then close).
    Drop,
    /// Accept connections and keep them open, forwarding nothing until the
    /// mode changes: a partition that heals delivers what was held.
    Blackhole,
}

impl Mode {
    /// A short name for tables and reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Delay(_) => "delay",
            Self::Drop => "drop",
            Self::Blackhole => "blackhole",
        }
    }
}

/// A running proxy; stops when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    accept: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on `127.0.0.1:0` and forwards to `target`, which must be a
    /// loopback address.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        if !target.ip().is_loopback() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("the fault proxy only forwards to loopback addresses, not {target}"),
            ));
        }
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, watching) = watch::channel(Mode::Pass);
        let accept = tokio::spawn(accept_loop(listener, target, watching));
        Ok(Self { addr, mode, accept })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches the mode for every connection, open or new.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Closes every open connection and lets new ones through: a cut the
    /// client sees as a broken connection, with the server back at once.
    pub async fn cut(&self) {
        self.set(Mode::Drop);
        // Each connection's pipes see the mode at their next poll.
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.set(Mode::Pass);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.mode.send_replace(Mode::Drop);
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, mode: watch::Receiver<Mode>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if *mode.borrow() == Mode::Drop {
            drop(client);
            continue;
        }
        let mode = mode.clone();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(target).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            // Either direction ending (a close, a drop) ends both.
            tokio::select! {
                () = pipe(client_read, server_write, mode.clone()) => {}
                () = pipe(server_read, client_write, mode) => {}
            }
        });
    }
}

/// Copies one direction chunk by chunk, obeying the mode before each write.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            _ = mode.wait_for(|mode| *mode == Mode::Drop) => return,
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Hold the chunk while the partition lasts; a drop ends it.
        let now = match mode.wait_for(|mode| *mode != Mode::Blackhole).await {
            Ok(now) => *now,
            Err(_) => return,
        };
        match now {
            Mode::Drop => return,
            Mode::Delay(delay) => tokio::time::sleep(delay).await,
            Mode::Pass | Mode::Blackhole => {}
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = socket.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream) -> std::io::Result<[u8; 4]> {
        stream.write_all(b"ping").await?;
        let mut answer = [0u8; 4];
        stream.read_exact(&mut answer).await?;
        Ok(answer)
    }

    #[tokio::test]
    async fn passes_holds_delays_and_drops() {
        let proxy = FaultProxy::start(echo().await).await.unwrap();
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(&round_trip(&mut stream).await.unwrap(), b"ping");

        proxy.set(Mode::Blackhole);
        let held = tokio::time::timeout(Duration::from_millis(200), round_trip(&mut stream)).await;
        assert!(held.is_err(), "a blackhole forwards nothing");
        proxy.set(Mode::Pass);
        let mut held = [0u8; 4];
        stream.read_exact(&mut held).await.unwrap();
        assert_eq!(&held, b"ping", "a healed partition delivers what it held");

        proxy.set(Mode::Delay(Duration::from_millis(50)));
        let started = std::time::Instant::now();
        round_trip(&mut stream).await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(100));

        proxy.set(Mode::Drop);
        assert!(round_trip(&mut stream).await.is_err());
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        assert!(
            round_trip(&mut fresh).await.is_err(),
            "new connections are closed"
        );
    }

    #[tokio::test]
    async fn a_cut_closes_open_connections_and_lets_new_ones_through() {
        let proxy = FaultProxy::start(echo().await).await.unwrap();
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(&round_trip(&mut stream).await.unwrap(), b"ping");
        proxy.cut().await;
        assert!(
            round_trip(&mut stream).await.is_err(),
            "the open connection was closed"
        );
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(&round_trip(&mut fresh).await.unwrap(), b"ping");
    }

    #[tokio::test]
    async fn refuses_a_target_off_loopback() {
        let error = FaultProxy::start("192.0.2.1:5432".parse().unwrap())
            .await
            .unwrap_err();
        assert!(error.to_string().contains("loopback"));
    }
}
