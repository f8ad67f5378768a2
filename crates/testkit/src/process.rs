//! Process-level tests of Capstan binaries: spawn a built binary, find the admin address it logs,
//! talk HTTP to it, send SIGTERM and wait for its exit; and the process `contract` every binary
//! keeps, checked the same way for each of them.
//!
//! ```no_run
//! # async fn demo() -> Result<(), capstan_testkit::process::TestingError> {
//! use capstan_testkit::process::{BinaryUnderTest, http_get};
//! let mut bin = BinaryUnderTest::spawn(env!("CARGO"), &["--metrics-addr", "127.0.0.1:0"]).await?;
//! assert_eq!(http_get(bin.admin_addr(), "/livez").await?.status, 200);
//! bin.sigterm()?;
//! assert!(bin.wait_exit(std::time::Duration::from_secs(10)).await?.success());
//! # Ok(()) }
//! ```

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// The marker every binary logs once its admin server is bound (see `Service::start`).
pub const ADMIN_LISTENING_MARKER: &str = "admin server listening on ";

/// Environment variables of the common flags, removed from a spawned binary's environment so
/// that the test's own environment cannot change what it tests.
pub const COMMON_ENV_VARS: &[&str] = &[
    "KUBECONFIG",
    "METRICS_ADDR",
    "LOG_FORMAT",
    "LOG_LEVEL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "LEADER_ELECT",
    "LEASE_NAME",
    "POD_NAMESPACE",
    "POD_NAME",
    "LEASE_DURATION_SECONDS",
    "LEASE_GRACE_SECONDS",
];

#[derive(Debug, thiserror::Error)]
pub enum TestingError {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("process exited before logging its admin address ({status:?}); output:\n{output}")]
    ExitedEarly {
        status: Option<ExitStatus>,
        output: String,
    },
    #[error("timed out after {after:?} waiting for {what}; output:\n{output}")]
    Timeout {
        what: &'static str,
        after: Duration,
        output: String,
    },
    #[error("signal failed: {0}")]
    Signal(#[from] nix::Error),
    #[error("malformed HTTP response: {0}")]
    Http(String),
}

/// Finds `ADDR` in a log line containing `admin server listening on ADDR` (text or JSON logs).
pub fn parse_admin_addr(line: &str) -> Option<SocketAddr> {
    let rest = &line[line.find(ADMIN_LISTENING_MARKER)? + ADMIN_LISTENING_MARKER.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '[' | ']')))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// A spawned binary whose stdout and stderr are captured line by line.
#[derive(Debug)]
pub struct BinaryUnderTest {
    child: Child,
    admin_addr: SocketAddr,
    output: Arc<Mutex<Vec<String>>>,
    /// The stdout/stderr readers; awaited after exit so the last lines are in `output`.
    captures: Vec<tokio::task::JoinHandle<()>>,
}

impl BinaryUnderTest {
    /// Spawns `program` with `args` (and without the [`COMMON_ENV_VARS`]), waits up to 30 s
    /// for its admin address line.
    pub async fn spawn<S: AsRef<OsStr>>(program: S, args: &[&str]) -> Result<Self, TestingError> {
        Self::spawn_with_env(program, args, &[]).await
    }

    /// Like [`spawn`](Self::spawn) with extra environment variables.
    pub async fn spawn_with_env<S: AsRef<OsStr>>(
        program: S,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Result<Self, TestingError> {
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for var in COMMON_ENV_VARS {
            command.env_remove(var);
        }
        command.envs(envs.iter().copied());
        let mut child = command.spawn()?;

        let output = Arc::new(Mutex::new(Vec::new()));
        let (lines_tx, mut lines_rx) = mpsc::unbounded_channel();
        let mut captures = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            captures.push(tokio::spawn(capture(
                stdout,
                output.clone(),
                lines_tx.clone(),
            )));
        }
        if let Some(stderr) = child.stderr.take() {
            captures.push(tokio::spawn(capture(stderr, output.clone(), lines_tx)));
        }

        let wait = Duration::from_secs(30);
        let found = tokio::time::timeout(wait, async {
            while let Some(line) = lines_rx.recv().await {
                if let Some(addr) = parse_admin_addr(&line) {
                    return Some(addr);
                }
            }
            None
        })
        .await;
        let snapshot = |output: &Arc<Mutex<Vec<String>>>| lines(output).join("\n");
        match found {
            Ok(Some(admin_addr)) => Ok(Self {
                child,
                admin_addr,
                output,
                captures,
            }),
            Ok(None) => {
                let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
                    .await
                    .ok()
                    .and_then(Result::ok);
                Err(TestingError::ExitedEarly {
                    status,
                    output: snapshot(&output),
                })
            }
            Err(_) => Err(TestingError::Timeout {
                what: "the admin address log line",
                after: wait,
                output: snapshot(&output),
            }),
        }
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Everything the process printed so far (stdout and stderr interleaved by arrival).
    pub fn output(&self) -> Vec<String> {
        lines(&self.output)
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) -> Result<(), TestingError> {
        self.signal(nix::sys::signal::Signal::SIGTERM)
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) -> Result<(), TestingError> {
        let pid = self
            .child
            .id()
            .ok_or(TestingError::Io(std::io::Error::other(
                "process already reaped",
            )))?;
        let pid = i32::try_from(pid).map_err(|_| std::io::Error::other("pid out of range"))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)?;
        Ok(())
    }

    /// Waits for the process to exit; kills it and errors after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus, TestingError> {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => {
                // The pipes close with the process; reading them to the end takes a moment.
                for capture in self.captures.drain(..) {
                    let _ = tokio::time::timeout(Duration::from_secs(5), capture).await;
                }
                Ok(status?)
            }
            Err(_) => {
                self.child.kill().await?;
                Err(TestingError::Timeout {
                    what: "the process to exit",
                    after: timeout,
                    output: self.output().join("\n"),
                })
            }
        }
    }
}

fn lines(output: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
    output
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

async fn capture<R: AsyncRead + Unpin>(
    reader: R,
    output: Arc<Mutex<Vec<String>>>,
    lines_tx: mpsc::UnboundedSender<String>,
) {
    let mut reader = BufReader::new(reader).lines();
    while let Ok(Some(line)) = reader.next_line().await {
        output
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(line.clone());
        // The receiver goes away once the address is found; keep capturing regardless.
        let _ = lines_tx.send(line);
    }
}

/// A parsed HTTP/1.1 response.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// A minimal HTTP/1.1 GET (`Connection: close`), enough for admin endpoints in tests.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<HttpResponse, TestingError> {
    http_request(addr, "GET", path, None).await
}

/// A minimal HTTP/1.1 PUT of a JSON body (`Connection: close`), for admin endpoints that take one.
pub async fn http_put_json(
    addr: SocketAddr,
    path: &str,
    body: &serde_json::Value,
) -> Result<HttpResponse, TestingError> {
    http_request(addr, "PUT", path, Some(body.to_string())).await
}

async fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    json_body: Option<String>,
) -> Result<HttpResponse, TestingError> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    match &json_body {
        Some(body) => request.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )),
        None => request.push_str("\r\n"),
    }
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .map_err(|_| TestingError::Http("response timed out".into()))??;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> Result<HttpResponse, TestingError> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| TestingError::Http(format!("no header end in {text:?}")))?;
    let mut head_lines = head.split("\r\n");
    let status_line = head_lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| TestingError::Http(format!("bad status line {status_line:?}")))?;
    let headers: Vec<(String, String)> = head_lines
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut response = HttpResponse {
        status,
        headers,
        body: body.to_owned(),
    };
    if response
        .header("transfer-encoding")
        .is_some_and(|te| te.eq_ignore_ascii_case("chunked"))
    {
        response.body = dechunk(body)?;
    }
    Ok(response)
}

fn dechunk(mut body: &str) -> Result<String, TestingError> {
    let mut out = String::new();
    loop {
        let (size_line, rest) = body
            .split_once("\r\n")
            .ok_or_else(|| TestingError::Http("truncated chunk".into()))?;
        let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| TestingError::Http(format!("bad chunk size {size_line:?}")))?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = rest
            .get(..size)
            .ok_or_else(|| TestingError::Http("short chunk".into()))?;
        out.push_str(chunk);
        body = rest.get(size + 2..).unwrap_or("");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_addr_is_found_in_text_and_json_logs() {
        let text = "2026-11-29T10:00:00Z  INFO capstan_runtime::service: admin server listening on 127.0.0.1:41234 service=\"x\"";
        assert_eq!(
            parse_admin_addr(text),
            Some("127.0.0.1:41234".parse().expect("addr"))
        );
        let json = r#"{"timestamp":"...","level":"INFO","fields":{"message":"admin server listening on [::1]:8080","service":"x"}}"#;
        assert_eq!(
            parse_admin_addr(json),
            Some("[::1]:8080".parse().expect("addr"))
        );
        assert_eq!(parse_admin_addr("admin server starting"), None);
    }

    #[test]
    fn responses_are_parsed_plain_and_chunked() {
        let plain = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 9\r\n\r\nnot ready";
        let response = parse_response(plain).expect("parses");
        assert_eq!(response.status, 503);
        assert_eq!(response.header("Content-Length"), Some("9"));
        assert_eq!(response.body, "not ready");
        let chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).expect("parses").body, "abcde");
    }
}

/// The process contract every Capstan binary keeps, checked the same way for each of them.
pub mod contract {
    use std::time::Duration;

    use super::{BinaryUnderTest, TestingError, http_get};

    const EXIT_WITHIN: Duration = Duration::from_secs(15);

    /// Polls `/readyz` until it answers 200 (at most 10 s).
    pub async fn wait_ready(bin: &BinaryUnderTest) {
        for _ in 0..200 {
            if http_get(bin.admin_addr(), "/readyz")
                .await
                .is_ok_and(|r| r.status == 200)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("never ready; output:\n{}", bin.output().join("\n"));
    }

    /// `program args --metrics-addr 127.0.0.1:0` serves `/livez`, becomes ready, serves OpenMetrics
    /// with its build info and leader gauge, and on SIGTERM drains and exits 0.
    pub async fn serves_admin_endpoints_and_exits_zero_on_sigterm(
        program: &str,
        args: &[&str],
        service: &str,
    ) {
        let mut all_args = args.to_vec();
        all_args.extend(["--metrics-addr", "127.0.0.1:0"]);
        let mut bin = BinaryUnderTest::spawn(program, &all_args)
            .await
            .expect("starts and logs its admin address");
        let addr = bin.admin_addr();
        assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");

        let livez = http_get(addr, "/livez").await.expect("livez");
        assert_eq!((livez.status, livez.body.as_str()), (200, "ok"));
        wait_ready(&bin).await;
        let metrics = http_get(addr, "/metrics").await.expect("metrics");
        assert_eq!(metrics.status, 200);
        let build_info = format!(r#"capstan_build_info{{service="{service}",version="#);
        assert!(metrics.body.contains(&build_info), "{}", metrics.body);
        assert!(
            metrics.body.contains("capstan_leader 1\n"),
            "no election: leader; {}",
            metrics.body
        );
        assert!(metrics.body.ends_with("# EOF\n"), "{}", metrics.body);

        bin.sigterm().expect("signal delivered");
        let status = bin.wait_exit(EXIT_WITHIN).await.expect("exits");
        let output = bin.output().join("\n");
        assert_eq!(status.code(), Some(0), "{output}");
        assert!(output.contains("shutdown requested"), "{output}");
        assert!(output.contains("admin server stopped"), "{output}");
    }

    /// Configured only through environment variables (`METRICS_ADDR`, `LOG_FORMAT=json`,
    /// `LOG_LEVEL` plus `envs`), the binary logs JSON records naming its service.
    pub async fn reads_flags_from_the_environment_and_logs_json(
        program: &str,
        args: &[&str],
        envs: &[(&str, &str)],
        service: &str,
    ) {
        let mut all_envs = vec![
            ("METRICS_ADDR", "127.0.0.1:0"),
            ("LOG_FORMAT", "json"),
            ("LOG_LEVEL", "info"),
        ];
        all_envs.extend_from_slice(envs);
        let mut bin = BinaryUnderTest::spawn_with_env(program, args, &all_envs)
            .await
            .expect("starts with env configuration");
        // METRICS_ADDR=127.0.0.1:0: loopback and a kernel-chosen port; the flag's default
        // (0.0.0.0:8080) would fail this, so an ignored METRICS_ADDR cannot pass.
        let addr = bin.admin_addr();
        assert!(
            addr.ip().is_loopback() && addr.port() != 0 && addr.port() != 8080,
            "METRICS_ADDR=127.0.0.1:0 not honoured: admin server on {addr}"
        );
        let livez = http_get(addr, "/livez").await.expect("livez");
        assert_eq!(livez.status, 200, "admin server serves on {addr}");
        let addr_line = bin
            .output()
            .into_iter()
            .find(|line| line.contains(super::ADMIN_LISTENING_MARKER))
            .expect("address line");
        let record: serde_json::Value =
            serde_json::from_str(&addr_line).expect("a JSON log record");
        assert_eq!(record["level"], "INFO", "{record}");
        assert_eq!(record["fields"]["service"], service, "{record}");

        bin.sigterm().expect("signal delivered");
        let status = bin.wait_exit(EXIT_WITHIN).await.expect("exits");
        assert!(status.success(), "{}", bin.output().join("\n"));
    }

    /// An invalid `--log-level` stops start-up with a non-zero exit and says why.
    pub async fn bad_configuration_exits_non_zero_without_serving(program: &str, args: &[&str]) {
        let mut all_args = args.to_vec();
        all_args.extend(["--log-level", "info,kube=loud"]);
        refused_at_start(program, &all_args, "invalid log level").await;
    }

    /// `program` with `args` (and a free admin port) exits non-zero before serving, printing
    /// `message`.
    pub async fn refused_at_start(program: &str, args: &[&str], message: &str) {
        let mut all_args = args.to_vec();
        all_args.extend(["--metrics-addr", "127.0.0.1:0"]);
        let error = BinaryUnderTest::spawn(program, &all_args)
            .await
            .expect_err("refused before serving");
        match error {
            TestingError::ExitedEarly { status, output } => {
                assert!(status.is_some_and(|s| !s.success()), "{output}");
                assert!(output.contains(message), "{args:?}: {output}");
            }
            other => panic!("unexpected {other}"),
        }
    }
}
