//! The smallest HTTP server Prometheus needs: `GET /metrics` answered with
//! the text exposition, anything else 404, one connection at a time (a
//! scrape every few seconds), each bounded in time so a stuck client cannot
//! hold the agent.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::metrics::Metrics;

const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub fn serve(listener: TcpListener, metrics: Arc<Mutex<Metrics>>) {
    let _ = std::thread::Builder::new()
        .name("gapscope-metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = answer(stream, &metrics);
            }
        });
}

fn answer(mut stream: TcpStream, metrics: &Mutex<Metrics>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // The headers, up to the blank line (their content is not needed).
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/metrics") => {
            let text = metrics
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .exposition(crate::collect::own_cost().cpu_ns, env!("CARGO_PKG_VERSION"));
            ("200 OK", text)
        }
        ("GET", "/") => (
            "200 OK",
            "gapscope agent: GPU idle time by cause, for Prometheus at /metrics\n".to_string(),
        ),
        _ => ("404 Not Found", "not found\n".to_string()),
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}
