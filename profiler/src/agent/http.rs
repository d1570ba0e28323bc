//! The HTTP server Prometheus scrapes: `GET` and `HEAD` of `/metrics` (the
//! text exposition) and of `/`; 404 for other paths, 405 for other methods,
//! `Connection: close` always.
//!
//! It answers whoever can reach the port, with no authentication, so no one
//! client may cost it more than a bounded share, and none may delay a scrape:
//!
//! - connections are served concurrently, as tasks of a current-thread tokio
//!   runtime on the server's own thread, at most [`MAX_CONNECTIONS`] at
//!   once; one more is closed as soon as it is accepted;
//! - the request line and headers are read into one buffer of [`MAX_HEAD`]
//!   bytes, never grown (431 past it), and must all arrive within
//!   [`REQUEST_DEADLINE`] of the accept, however the bytes trickle in;
//! - the answer must be taken within [`WRITE_DEADLINE`].
//!
//! A connection therefore holds its slot for at most the sum of the two
//! deadlines, and what it costs in memory is the head buffer plus one answer.
//!
//! Tokio rather than a thread per connection or a pool: it is already linked
//! and run this way by the recorder; an idle connection costs a small task
//! instead of a thread's stack; a deadline over the whole request is one
//! `timeout` instead of socket timeouts that restart at every byte. The only
//! work a request does — formatting the exposition under the metrics lock —
//! is short, and more threads would only queue on that lock.
//!
//! The agent listens on 127.0.0.1 unless told otherwise (see the deploy
//! files for reaching it from a Prometheus server).

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;

use super::metrics::Metrics;

/// Prometheus holds one connection per scrape; an HA pair, a reverse
/// proxy's health checks and a person with curl fit many times over, while
/// 32 × (head buffer + one exposition) stays small beside the agent's own
/// memory. Someone who fills every slot loses each within the two deadlines.
const MAX_CONNECTIONS: usize = 32;

/// Prometheus sends a few hundred bytes of request line and headers; 8 KiB
/// is what common servers allow a header line by default.
const MAX_HEAD: usize = 8 * 1024;

/// Prometheus writes its request as soon as it has connected; 3 s leaves
/// room for a lost segment's retransmission (1 s initial RTO) on a remote
/// link while bounding how long a slow client keeps a slot.
const REQUEST_DEADLINE: Duration = Duration::from_secs(3);

/// The answer is built in memory before it is written, so only a client that
/// does not read can take long; it gets as long as a scrape's default
/// timeout gives Prometheus itself to wait.
const WRITE_DEADLINE: Duration = Duration::from_secs(5);

const EXPOSITION: &str = "text/plain; version=0.0.4; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

/// Serves `listener` on a thread of its own, for the life of the process.
pub fn serve(listener: std::net::TcpListener, metrics: Arc<Mutex<Metrics>>) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    let listener = {
        // The listener registers with this runtime's reactor.
        let _in = runtime.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    std::thread::Builder::new()
        .name("gapscope-metrics".into())
        .spawn(move || runtime.block_on(accept(listener, metrics)))?;
    Ok(())
}

async fn accept(listener: tokio::net::TcpListener, metrics: Arc<Mutex<Metrics>>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of descriptors, typically: the connection stays
                // queued, so trying again at once would spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // No answer for one over the bound: writing one could itself wait on
        // the client, and dropping the stream closes it now.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _ = answer(stream, &metrics).await;
            drop(slot);
        });
    }
}

/// One request, one answer, then the connection is closed.
async fn answer<S>(mut stream: S, metrics: &Mutex<Metrics>) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let head = match tokio::time::timeout(REQUEST_DEADLINE, read_head(&mut stream, MAX_HEAD)).await
    {
        Ok(head) => head?,
        // A client this slow would not read an answer in time either.
        Err(_) => return Ok(()),
    };
    let response = match head {
        Head::Complete(head) | Head::Ended(head) => respond(&head, metrics),
        Head::TooLarge => response(
            "431 Request Header Fields Too Large",
            TEXT,
            b"request line and headers too large\n",
            "",
            true,
        ),
    };
    match tokio::time::timeout(WRITE_DEADLINE, async {
        stream.write_all(&response).await?;
        stream.shutdown().await
    })
    .await
    {
        Ok(written) => written,
        Err(_) => Err(io::ErrorKind::TimedOut.into()),
    }
}

#[derive(Debug, PartialEq)]
enum Head {
    /// Up to and including the blank line.
    Complete(Vec<u8>),
    /// The client stopped sending before a blank line: answered from what
    /// came, as before (a request line alone is enough).
    Ended(Vec<u8>),
    /// No blank line within the cap.
    TooLarge,
}

/// Reads the request line and headers into a buffer of `cap` bytes, never
/// more: the client's size and pace cannot make it grow.
async fn read_head<R: AsyncRead + Unpin>(reader: &mut R, cap: usize) -> io::Result<Head> {
    let mut buf = vec![0u8; cap];
    let mut len = 0;
    loop {
        if len == cap {
            return Ok(Head::TooLarge);
        }
        let n = reader.read(&mut buf[len..]).await?;
        if n == 0 {
            buf.truncate(len);
            return Ok(Head::Ended(buf));
        }
        // The blank line may straddle two reads ("\n\r" then "\n").
        let from = len.saturating_sub(2);
        len += n;
        if let Some(end) = end_of_head(&buf[from..len]) {
            buf.truncate(from + end);
            return Ok(Head::Complete(buf));
        }
    }
}

/// Where the first empty line ends, bare LF accepted as clients send it.
fn end_of_head(bytes: &[u8]) -> Option<usize> {
    (0..bytes.len()).find_map(|i| match &bytes[i..] {
        [b'\n', b'\n', ..] => Some(i + 2),
        [b'\n', b'\r', b'\n', ..] => Some(i + 3),
        _ => None,
    })
}

fn respond(head: &[u8], metrics: &Mutex<Metrics>) -> Vec<u8> {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let mut words = line
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty());
    let (Some(method), Some(target)) = (words.next(), words.next()) else {
        return response("400 Bad Request", TEXT, b"bad request\n", "", true);
    };
    let with_body = match method {
        b"GET" => true,
        b"HEAD" => false,
        _ => {
            return response(
                "405 Method Not Allowed",
                TEXT,
                b"method not allowed\n",
                "Allow: GET, HEAD\r\n",
                true,
            )
        }
    };
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    match path {
        // HEAD builds the exposition too: its Content-Length must be GET's.
        b"/metrics" => {
            let text = metrics
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .exposition(crate::collect::own_cost().cpu_ns, env!("CARGO_PKG_VERSION"));
            response("200 OK", EXPOSITION, text.as_bytes(), "", with_body)
        }
        b"/" => response(
            "200 OK",
            TEXT,
            b"gapscope agent: GPU idle time by cause, for Prometheus at /metrics\n",
            "",
            with_body,
        ),
        _ => response("404 Not Found", TEXT, b"not found\n", "", with_body),
    }
}

/// `extra`: more header lines, each ending in CRLF.
fn response(
    status: &str,
    content_type: &str,
    body: &[u8],
    extra: &str,
    with_body: bool,
) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if with_body {
        out.extend_from_slice(body);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{ErrorKind, Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::thread::sleep;

    /// The longest a test waits on the server: the request deadline and
    /// then some, for a loaded machine.
    const PATIENCE: Duration = Duration::from_secs(8);
    const SCRAPE: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: agent\r\nAccept: text/plain\r\n\r\n";

    fn start() -> SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        serve(listener, Arc::new(Mutex::new(Metrics::default()))).unwrap();
        addr
    }

    fn connect(addr: SocketAddr) -> TcpStream {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        s.set_write_timeout(Some(PATIENCE)).unwrap();
        s
    }

    /// (status line, header lines, body) of one request's answer.
    fn exchange(addr: SocketAddr, request: &[u8]) -> (String, String, Vec<u8>) {
        let mut s = connect(addr);
        s.write_all(request).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)
            .unwrap_or_else(|e| panic!("no whole answer within {PATIENCE:?}: {e}"));
        let end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no blank line in {:?}", String::from_utf8_lossy(&raw)));
        let head = String::from_utf8(raw[..end].to_vec()).unwrap();
        let (status, headers) = head.split_once("\r\n").unwrap_or((&head, ""));
        (
            status.to_string(),
            headers.to_string(),
            raw[end + 4..].to_vec(),
        )
    }

    fn header<'a>(headers: &'a str, name: &str) -> Option<&'a str> {
        headers.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    /// Whether the server has not closed `s` (nothing to read, no EOF).
    fn is_open(s: &TcpStream) -> bool {
        s.set_nonblocking(true).unwrap();
        let r = s.peek(&mut [0u8]);
        s.set_nonblocking(false).unwrap();
        matches!(r, Err(e) if e.kind() == ErrorKind::WouldBlock)
    }

    /// Reads until the server closes `s`; panics if it does not within
    /// `limit`.
    fn expect_closed(s: &mut TcpStream, limit: Duration, what: &str) -> Vec<u8> {
        s.set_read_timeout(Some(limit)).unwrap();
        let mut got = Vec::new();
        match s.read_to_end(&mut got) {
            Ok(_) => got,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => got,
            Err(e) => panic!("{what}: still open after {limit:?} ({e})"),
        }
    }

    #[test]
    fn a_scrape_is_answered_beside_idle_and_trickling_clients() {
        let addr = start();
        // Silent, and stalled mid-headers.
        let idle: Vec<TcpStream> = (0..12)
            .map(|i| {
                let mut s = connect(addr);
                if i % 2 == 1 {
                    s.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
                }
                s
            })
            .collect();
        std::thread::spawn(move || {
            let mut s = connect(addr);
            for &b in SCRAPE {
                if s.write_all(&[b]).is_err() {
                    break;
                }
                sleep(Duration::from_secs(1));
            }
        });
        // The server has taken them all before the scrape comes.
        sleep(Duration::from_millis(300));
        let (status, headers, body) = exchange(addr, SCRAPE);
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert_eq!(header(&headers, "Content-Type"), Some(EXPOSITION));
        let body = String::from_utf8(body).unwrap();
        assert!(body.contains("gapscope_agent_info{"), "{body}");
        assert!(
            idle.iter().all(is_open),
            "the scrape waited for the idle clients to be dropped"
        );
    }

    #[test]
    fn a_trickling_client_is_cut_at_the_request_deadline() {
        let addr = start();
        let mut s = connect(addr);
        let mut w = s.try_clone().unwrap();
        // A byte every half second: no read ever waits long, the request
        // never ends.
        std::thread::spawn(move || {
            let _ = w.write_all(b"GET /metrics HTTP/1.1\r\nX-Pad: ");
            for _ in 0..40 {
                if w.write_all(b"a").is_err() {
                    break;
                }
                sleep(Duration::from_millis(500));
            }
        });
        let got = expect_closed(&mut s, PATIENCE, "trickling client");
        assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    }

    #[test]
    fn an_endless_request_line_is_refused_at_the_cap() {
        const SENDING: usize = 64 << 20;
        let addr = start();
        let mut s = connect(addr);
        let mut w = s.try_clone().unwrap();
        let sent = std::thread::spawn(move || {
            let chunk = vec![b'A'; 64 << 10];
            let mut sent = 0;
            while sent < SENDING {
                match w.write(&chunk) {
                    Ok(n) => sent += n,
                    Err(_) => break,
                }
            }
            sent
        });
        // The 431, unless the reset for the unread bytes overtook it.
        let got = expect_closed(&mut s, PATIENCE, "endless request line");
        assert!(
            got.is_empty() || got.starts_with(b"HTTP/1.1 431 "),
            "{:?}",
            String::from_utf8_lossy(&got)
        );
        // What socket buffers took is a few MiB at most; the server read
        // no more than the cap of it (see the_head_reader_stops_at_the_cap).
        let sent = sent.join().unwrap();
        assert!(sent < SENDING, "the server took all {sent} bytes");
        assert_eq!(exchange(addr, SCRAPE).0, "HTTP/1.1 200 OK");
    }

    #[test]
    fn head_is_answered_with_headers_only() {
        let addr = start();
        for path in ["/metrics", "/"] {
            let (status, headers, body) = exchange(
                addr,
                format!("HEAD {path} HTTP/1.1\r\nHost: agent\r\n\r\n").as_bytes(),
            );
            assert_eq!(status, "HTTP/1.1 200 OK", "{path}");
            assert!(
                body.is_empty(),
                "{path}: {:?}",
                String::from_utf8_lossy(&body)
            );
            let (_, get_headers, get_body) =
                exchange(addr, format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes());
            assert_eq!(
                header(&headers, "Content-Type"),
                header(&get_headers, "Content-Type")
            );
            let length: usize = header(&headers, "Content-Length").unwrap().parse().unwrap();
            if path == "/" {
                assert_eq!(length, get_body.len());
            } else {
                // The agent's CPU seconds may have gained a digit between
                // the two.
                assert!(
                    length.abs_diff(get_body.len()) < 8,
                    "{length} vs {}",
                    get_body.len()
                );
            }
        }
    }

    #[test]
    fn connections_past_the_bound_are_closed_at_once() {
        let addr = start();
        let held: Vec<TcpStream> = (0..MAX_CONNECTIONS).map(|_| connect(addr)).collect();
        let mut extra = connect(addr);
        // Well before the held ones' deadline could free a slot.
        let got = expect_closed(
            &mut extra,
            REQUEST_DEADLINE / 2,
            "connection past the bound",
        );
        assert!(got.is_empty());
        assert!(held.iter().all(is_open));
        drop(held);
        // Their slots come back as the server sees them close.
        let mut status = String::new();
        for _ in 0..20 {
            let mut s = connect(addr);
            s.write_all(SCRAPE).unwrap();
            let mut raw = Vec::new();
            let _ = s.read_to_end(&mut raw);
            status = String::from_utf8_lossy(&raw)
                .lines()
                .next()
                .unwrap_or("")
                .into();
            if !status.is_empty() {
                break;
            }
            sleep(Duration::from_millis(100));
        }
        assert_eq!(status, "HTTP/1.1 200 OK");
    }

    #[test]
    fn requests_keep_their_answers() {
        let addr = start();
        let status = |req: &[u8]| exchange(addr, req).0;
        let (_, headers, body) = exchange(addr, b"GET / HTTP/1.0\r\n\r\n");
        assert_eq!(header(&headers, "Content-Type"), Some(TEXT));
        assert!(String::from_utf8(body).unwrap().contains("/metrics"));
        assert_eq!(
            status(b"GET /metrics?x=1 HTTP/1.1\r\n\r\n"),
            "HTTP/1.1 200 OK"
        );
        assert_eq!(status(b"GET /metrics\n\n"), "HTTP/1.1 200 OK");
        assert_eq!(
            status(b"GET /nope HTTP/1.1\r\n\r\n"),
            "HTTP/1.1 404 Not Found"
        );
        assert_eq!(
            status(b"HEAD /nope HTTP/1.1\r\n\r\n"),
            "HTTP/1.1 404 Not Found"
        );
        assert_eq!(
            status(b"GET http://agent/metrics HTTP/1.1\r\n\r\n"),
            "HTTP/1.1 404 Not Found"
        );
        let (status, headers, _) = exchange(addr, b"POST /metrics HTTP/1.1\r\n\r\n");
        assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
        assert_eq!(header(&headers, "Allow"), Some("GET, HEAD"));
        assert_eq!(exchange(addr, b"\r\n\r\n").0, "HTTP/1.1 400 Bad Request");
        assert_eq!(
            exchange(addr, b"\xff\xfe /\r\n\r\n").0,
            "HTTP/1.1 405 Method Not Allowed"
        );
        // The request line alone, then the client's end: answered.
        let mut s = connect(addr);
        s.write_all(b"GET /metrics HTTP/1.0\r\n").unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let got = expect_closed(&mut s, PATIENCE, "half-closed client");
        assert!(got.starts_with(b"HTTP/1.1 200 OK\r\n"));
    }

    #[tokio::test]
    async fn the_head_reader_stops_at_the_cap() {
        const SENDING: u64 = 64 << 20;
        let mut endless = tokio::io::repeat(b'A').take(SENDING);
        assert_eq!(
            read_head(&mut endless, MAX_HEAD).await.unwrap(),
            Head::TooLarge
        );
        assert!(SENDING - endless.limit() <= MAX_HEAD as u64);
        // A blank line in the cap's last bytes still ends the head.
        let mut head = vec![b'A'; MAX_HEAD - 4];
        head.extend_from_slice(b"\r\n\r\n");
        let mut exact = &head[..];
        assert_eq!(
            read_head(&mut exact, MAX_HEAD).await.unwrap(),
            Head::Complete(head.clone())
        );
    }

    #[tokio::test]
    async fn the_blank_line_is_found_across_reads() {
        for request in [
            &b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..],
            b"GET / HTTP/1.1\nHost: a\n\n",
        ] {
            // One byte per read.
            let (mut client, mut server) = tokio::io::duplex(1);
            let (head, _client) = tokio::join!(read_head(&mut server, MAX_HEAD), async {
                client.write_all(request).await.unwrap();
                // Kept open: the head must end on its blank line, not EOF.
                client
            });
            assert_eq!(head.unwrap(), Head::Complete(request.to_vec()));
        }
        // Bytes after the blank line are not the head's.
        let mut pipelined = &b"GET / HTTP/1.1\r\n\r\nGET /x HTTP/1.1\r\n\r\n"[..];
        assert_eq!(
            read_head(&mut pipelined, MAX_HEAD).await.unwrap(),
            Head::Complete(b"GET / HTTP/1.1\r\n\r\n".to_vec())
        );
    }

    #[tokio::test]
    async fn too_large_a_head_is_answered_431() {
        let metrics = Mutex::new(Metrics::default());
        let (mut client, server) = tokio::io::duplex(64 << 10);
        let (served, got) = tokio::join!(answer(server, &metrics), async {
            let mut request = b"GET /metrics HTTP/1.1\r\nX-Pad: ".to_vec();
            request.resize(MAX_HEAD + 1, b'a');
            client.write_all(&request).await.unwrap();
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        });
        served.unwrap();
        assert!(
            got.starts_with(b"HTTP/1.1 431 "),
            "{:?}",
            String::from_utf8_lossy(&got)
        );
    }
}
