//! A tiny container for kube-sim's kubelet tests (run through `--exec-images`): prints its
//! arguments and environment, serves HTTP on `$POD_IP:$PORT` (`/ready` answers 200 while ready,
//! `/unready` switches readiness off, `/exit?code=N` exits with N) and exits 0 on SIGTERM,
//! saying so. Not a product binary.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    say(&format!(
        "started pod={} ip={}",
        env("POD_NAME"),
        env("POD_IP")
    ));
    say(&format!("args: {}", args.join(" ")));
    eprintln!("greeting on stderr: {}", env("GREETING"));
    let addr = format!(
        "{}:{}",
        env("POD_IP"),
        std::env::var("PORT").unwrap_or("8080".into())
    );
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    say(&format!("listening on {addr}"));
    let ready = Arc::new(AtomicBool::new(true));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let (mut conn, _) = tokio::select! {
            c = listener.accept() => c?,
            _ = term.recv() => {
                say("got SIGTERM, exiting");
                return Ok(());
            }
        };
        // The request head, up to its blank line.
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let request = String::from_utf8_lossy(&head).to_string();
        let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
        let (code, body) = match path.as_str() {
            "/ready" if ready.load(Ordering::SeqCst) => (200, "ready".to_string()),
            "/ready" => (503, "not ready".to_string()),
            "/unready" => {
                ready.store(false, Ordering::SeqCst);
                (200, "now unready".to_string())
            }
            p if p.starts_with("/exit") => {
                let code: i32 = p
                    .rsplit('=')
                    .next()
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                let _ = conn
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nbye bye",
                    )
                    .await;
                let _ = conn.shutdown().await;
                say(&format!("exiting with {code}"));
                std::process::exit(code);
            }
            _ => (200, format!("hello from {}", env("POD_NAME"))),
        };
        let reply = format!(
            "HTTP/1.1 {code} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = conn.write_all(reply.as_bytes()).await;
        let _ = conn.shutdown().await;
    }
}
