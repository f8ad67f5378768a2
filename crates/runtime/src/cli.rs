//! Flags every Capstan binary accepts, each with an environment variable, the same names everywhere.
//! Flatten [`CommonArgs`] into a binary's own `clap::Parser` with `#[command(flatten)]`.

use std::net::SocketAddr;
use std::path::PathBuf;

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::RuntimeError;

/// Log line format.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (for log shippers).
    Json,
}

/// Flags shared by every binary. `Default` equals the flag defaults (with no environment), so
/// code that builds one by hand can write `CommonArgs { kubeconfig, ..CommonArgs::default() }`.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct CommonArgs {
    /// Path to a kubeconfig (a `:`-separated list is merged like kubectl does). Without it the
    /// client is inferred: in-cluster service account, then `~/.kube/config`.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Address of the admin HTTP server (`/metrics`, `/livez`, `/readyz`). Port 0 picks a free port;
    /// the bound address is logged as `admin server listening on ADDR`.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,

    /// Log line format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter, an `EnvFilter` directive such as `info` or `info,kube=debug`.
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// OTLP/gRPC endpoint for traces (for example `http://otel-collector:4317`); no traces are
    /// exported without it.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    #[command(flatten)]
    pub leader: LeaderElectionArgs,
}

/// Leader election flags (a `coordination.k8s.io/v1` Lease).
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct LeaderElectionArgs {
    /// Elect a leader through a Lease so that only one replica writes. Without it this replica
    /// always acts as leader.
    #[arg(
        long,
        env = "LEADER_ELECT",
        num_args = 0..=1,
        default_value = "false",
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub leader_elect: bool,

    /// Name of the Lease; defaults to the binary's name.
    #[arg(long, env = "LEASE_NAME")]
    pub lease_name: Option<String>,

    /// Namespace of the Lease; defaults to the pod's namespace.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,

    /// How long a held Lease stays valid without renewal.
    #[arg(long, env = "LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub lease_duration_seconds: u64,

    /// How long before expiry the holder renews (also the tolerated clock skew).
    #[arg(long, env = "LEASE_GRACE_SECONDS", default_value_t = 5)]
    pub lease_grace_seconds: u64,

    /// Holder identity; defaults to the pod name, then the host name.
    #[arg(long = "lease-identity", env = "POD_NAME")]
    pub identity: Option<String>,
}

impl Default for CommonArgs {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            metrics_addr: SocketAddr::from(([0, 0, 0, 0], 8080)),
            log_format: LogFormat::Text,
            log_level: "info".to_owned(),
            otlp_endpoint: None,
            leader: LeaderElectionArgs::default(),
        }
    }
}

impl Default for LeaderElectionArgs {
    fn default() -> Self {
        Self {
            leader_elect: false,
            lease_name: None,
            lease_namespace: "default".to_owned(),
            lease_duration_seconds: 15,
            lease_grace_seconds: 5,
            identity: None,
        }
    }
}

impl LeaderElectionArgs {
    /// The Lease name, or `default_name` (usually the binary's name) when none was given.
    pub fn lease_name_or<'a>(&'a self, default_name: &'a str) -> &'a str {
        self.lease_name
            .as_deref()
            .filter(|name| !name.is_empty())
            .unwrap_or(default_name)
    }

    /// The holder identity: `--lease-identity`/`POD_NAME`, else the host name.
    pub fn holder_identity(&self) -> String {
        if let Some(identity) = self.identity.as_deref().filter(|id| !id.is_empty()) {
            return identity.to_owned();
        }
        hostname().unwrap_or_else(|| format!("capstan-{}", std::process::id()))
    }

    /// Checks the timing rules the Lease manager relies on (it panics on violations).
    pub fn validate(&self) -> Result<(), RuntimeError> {
        if self.lease_grace_seconds == 0 || self.lease_duration_seconds == 0 {
            return Err(RuntimeError::LeaderConfig(
                "lease duration and grace must be greater than zero".into(),
            ));
        }
        if self.lease_grace_seconds >= self.lease_duration_seconds {
            return Err(RuntimeError::LeaderConfig(format!(
                "lease grace ({}s) must be shorter than the lease duration ({}s)",
                self.lease_grace_seconds, self.lease_duration_seconds
            )));
        }
        if self.lease_namespace.is_empty() {
            return Err(RuntimeError::LeaderConfig(
                "lease namespace must not be empty".into(),
            ));
        }
        Ok(())
    }
}

fn hostname() -> Option<String> {
    let from_kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    from_kernel
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
}

impl CommonArgs {
    /// [`kube_client_for`](Self::kube_client_for) named after the running executable.
    pub async fn kube_client(&self) -> Result<kube::Client, RuntimeError> {
        let executable = std::env::current_exe().ok();
        let name = executable
            .as_deref()
            .and_then(std::path::Path::file_stem)
            .and_then(std::ffi::OsStr::to_str)
            .unwrap_or("capstan");
        self.kube_client_for(name).await
    }

    /// Builds a Kubernetes client for the binary `name`: from `--kubeconfig` when given, else
    /// inferred (in-cluster, then the default kubeconfig). Every request carries the User-Agent
    /// `<name>/<version>` (API request accounting and audit logs name the binary) and makes a
    /// `kube_api` span (see [`crate::http_trace`]).
    pub async fn kube_client_for(&self, name: &str) -> Result<kube::Client, RuntimeError> {
        let mut config = match &self.kubeconfig {
            Some(paths) => {
                let kubeconfig = read_kubeconfig_paths(paths)?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                    .await
                    .map_err(|source| RuntimeError::KubeconfigRead {
                        path: paths.clone(),
                        source,
                    })?
            }
            None => kube::Config::infer().await?,
        };
        let agent = user_agent_of(name, &self.leader.holder_identity());
        if let Ok(value) = http::HeaderValue::from_str(&agent) {
            config.headers.push((http::header::USER_AGENT, value));
        }
        let client = kube::client::ClientBuilder::try_from(config)
            .map_err(RuntimeError::KubeClient)?
            .with_layer(&crate::http_trace::TraceLayer::kube_api())
            .build();
        Ok(client)
    }
}

/// `<binary>/<version>`: the User-Agent of every Capstan binary's clients.
pub fn user_agent(binary: &str) -> String {
    format!("{binary}/{}", env!("CARGO_PKG_VERSION"))
}

/// `<binary>/<version> (<identity>)`: the User-Agent with the replica's identity (the pod name) as
/// a comment, so that kube-sim's accounting and audit logs tell the replicas of one controller
/// apart; the product before `/` (what request accounting groups by) is unchanged.
pub fn user_agent_of(binary: &str, identity: &str) -> String {
    let comment: String = identity
        .chars()
        .filter(|c| c.is_ascii_graphic() && !matches!(c, '(' | ')' | '\\'))
        .collect();
    if comment.is_empty() {
        user_agent(binary)
    } else {
        format!("{} ({comment})", user_agent(binary))
    }
}

/// The replica identity in a User-Agent written by [`user_agent_of`].
pub fn identity_of_user_agent(agent: &str) -> Option<&str> {
    let start = agent.find('(')?;
    let end = agent[start..].find(')')? + start;
    Some(&agent[start + 1..end]).filter(|id| !id.is_empty())
}

/// How replicas of a shardable controller share the work (`--shards`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ShardMode {
    /// One replica works, the others stand by (leader election), as before.
    #[default]
    Off,
    /// Every replica owns about 1/N of the objects (a Lease per replica, see `sharding`).
    Auto,
}

/// The sharding flag of controllers that support it; flatten it next to [`CommonArgs`].
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardingArgs {
    /// `off`: one elected replica reconciles, the others stand by. `auto`: every replica holds a
    /// shard Lease `<ring>-<pod>` and reconciles its share; the elected leader assigns objects
    /// to shards. Needs `--leader-elect` and a unique `POD_NAME` per replica.
    #[arg(long = "shards", env = "SHARDS", value_enum, default_value_t = ShardMode::Off)]
    pub mode: ShardMode,
}

impl ShardingArgs {
    pub fn enabled(&self) -> bool {
        self.mode == ShardMode::Auto
    }

    /// `--shards auto` needs `--leader-elect`: the elected leader assigns the objects
    /// (`leader_work` names what else it does), and the election's identity is the shard id.
    pub fn check(&self, leader: &LeaderElectionArgs, leader_work: &str) -> Result<(), String> {
        if self.enabled() && !leader.leader_elect {
            return Err(format!(
                "--shards auto needs --leader-elect: the elected leader {leader_work}, and the \
                 election's identity (--lease-identity, POD_NAME) is the shard id"
            ));
        }
        Ok(())
    }
}

/// Parses a count flag (`--workers`, `--machine-concurrency`): a whole number of at least 1, as
/// 0 would start no workers and nothing would ever be reconciled. Use as
/// `#[arg(value_parser = parse_count::<usize>)]`; clap names the flag in the error.
pub fn parse_count<T: TryFrom<u64>>(text: &str) -> Result<T, String> {
    let n: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("expected a whole number of at least 1, got {text:?}"))?;
    if n == 0 {
        return Err("must be at least 1 (with 0 nothing would ever be reconciled)".into());
    }
    T::try_from(n).map_err(|_| format!("{n} is too large"))
}

/// Reads one kubeconfig or a `:`-separated list (the `KUBECONFIG` convention), merged in order.
fn read_kubeconfig_paths(paths: &std::path::Path) -> Result<Kubeconfig, RuntimeError> {
    let mut merged: Option<Kubeconfig> = None;
    for path in std::env::split_paths(paths).filter(|p| !p.as_os_str().is_empty()) {
        let read_error = |source| RuntimeError::KubeconfigRead {
            path: path.clone(),
            source,
        };
        let next = Kubeconfig::read_from(&path).map_err(read_error)?;
        merged = Some(match merged {
            None => next,
            Some(current) => current.merge(next).map_err(read_error)?,
        });
    }
    merged.ok_or_else(|| RuntimeError::KubeconfigRead {
        path: paths.to_path_buf(),
        source: kube::config::KubeconfigError::FindPath,
    })
}

#[cfg(test)]
mod tests {
    use super::{identity_of_user_agent, parse_count, user_agent_of};

    #[test]
    fn sharding_needs_leader_election_and_says_why() {
        let auto = super::ShardingArgs {
            mode: super::ShardMode::Auto,
        };
        let mut leader = super::LeaderElectionArgs::default();
        let refused = auto
            .check(&leader, "assigns nodes")
            .expect_err("no election");
        assert!(
            refused.starts_with(
                "--shards auto needs --leader-elect: the elected leader assigns nodes"
            ),
            "{refused}"
        );
        assert_eq!(super::ShardingArgs::default().check(&leader, "x"), Ok(()));
        leader.leader_elect = true;
        assert_eq!(auto.check(&leader, "x"), Ok(()));
    }

    #[test]
    fn the_user_agent_names_the_replica_in_a_comment() {
        let agent = user_agent_of("nodeslo-controller", "nodeslo-controller-7d9f-x2");
        assert_eq!(
            agent,
            "nodeslo-controller/0.1.0 (nodeslo-controller-7d9f-x2)"
        );
        assert_eq!(
            identity_of_user_agent(&agent),
            Some("nodeslo-controller-7d9f-x2")
        );
        // Characters that would end the comment are dropped, not passed through.
        assert_eq!(user_agent_of("a", "x(y)z"), "a/0.1.0 (xyz)");
        assert_eq!(user_agent_of("a", "()"), "a/0.1.0");
        assert_eq!(identity_of_user_agent("kubectl/v1.33.0"), None);
    }

    #[test]
    fn counts_are_whole_numbers_of_at_least_one() {
        assert_eq!(parse_count::<usize>("1"), Ok(1));
        assert_eq!(parse_count::<u16>(" 65535 "), Ok(65535));
        assert_eq!(
            parse_count::<usize>("0"),
            Err("must be at least 1 (with 0 nothing would ever be reconciled)".to_string())
        );
        assert_eq!(
            parse_count::<u16>("65536"),
            Err("65536 is too large".to_string())
        );
        assert!(parse_count::<u16>("-1").is_err());
        assert!(parse_count::<u16>("two").is_err());
    }
}
