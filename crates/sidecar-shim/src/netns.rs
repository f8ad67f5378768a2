//! Netlink connections, optionally inside another network namespace.
//!
//! A socket belongs to the namespace it was created in, so a connection for a
//! named namespace is opened on a short-lived thread that first joins it
//! (`setns` affects only the calling thread); the gRPC listener stays in the
//! process's own namespace. Production runs without `--netns`: the sidecar
//! shares its pod's namespace.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::backend::BackendError;

/// An rtnetlink connection used one request at a time: the kernel answers a second
/// dump on a socket while the first is still running with EBUSY.
#[derive(Debug, Clone)]
pub struct Netlink {
    handle: rtnetlink::Handle,
    serial: Arc<tokio::sync::Mutex<()>>,
}

/// Exclusive use of the connection until dropped.
#[derive(Debug)]
pub struct NetlinkGuard<'a> {
    _serial: tokio::sync::MutexGuard<'a, ()>,
    pub handle: &'a rtnetlink::Handle,
}

impl Netlink {
    /// Connects in the namespace at `netns`, or in the caller's own (see [`connect`]).
    pub fn connect(netns: Option<&Path>) -> Result<Self, BackendError> {
        Ok(Self {
            handle: connect(netns)?,
            serial: Arc::default(),
        })
    }

    /// Fails with [`BackendError::MissingNetAdmin`] when the kernel refuses changes. Reads need
    /// no capability, so without this check a sidecar lacking CAP_NET_ADMIN would start, report
    /// ready, and fail every change later. The probe is an empty RTM_SETLINK on the loopback link
    /// (ifindex 1 in every namespace): the kernel checks CAP_NET_ADMIN before anything else, and
    /// a message without attributes or flags changes nothing. Any answer but EPERM passes.
    pub async fn require_net_admin(&self) -> Result<(), BackendError> {
        const LOOPBACK_IFINDEX: u32 = 1;
        let probe = rtnetlink::LinkUnspec::new_with_index(LOOPBACK_IFINDEX).build();
        let netlink = self.lock().await;
        match netlink.handle.link().set(probe).execute().await {
            Err(rtnetlink::Error::NetlinkError(error)) if error.raw_code().abs() == EPERM => {
                Err(BackendError::MissingNetAdmin {
                    credentials: credentials(),
                })
            }
            Err(error) => {
                tracing::debug!(%error, "CAP_NET_ADMIN probe answered other than EPERM");
                Ok(())
            }
            Ok(()) => Ok(()),
        }
    }

    pub async fn lock(&self) -> NetlinkGuard<'_> {
        NetlinkGuard {
            _serial: self.serial.lock().await,
            handle: &self.handle,
        }
    }
}

const EPERM: i32 = 1;

/// "uid 65532, CapEff 0000000000000000": who the kernel refused, for the start-up error.
fn credentials() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(|rest| {
                rest.split_whitespace()
                    .nth(1)
                    .unwrap_or(rest.trim())
                    .to_owned()
            })
            .unwrap_or_else(|| "?".to_owned())
    };
    let capabilities = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .map_or("?", str::trim);
    format!("effective uid {}, CapEff {capabilities}", field("Uid:"))
}

/// Opens an rtnetlink connection in the namespace at `netns` (e.g. `/run/netns/NAME`),
/// or in the caller's own namespace, and drives it on the current Tokio runtime.
pub fn connect(netns: Option<&Path>) -> Result<rtnetlink::Handle, BackendError> {
    let runtime = tokio::runtime::Handle::current();
    in_namespace(netns, move || {
        let _entered = runtime.enter();
        let (connection, handle, _messages) = rtnetlink::new_connection()?;
        tokio::spawn(connection);
        Ok(handle)
    })
}

/// Runs `open` in the namespace at `netns` (on a short-lived thread that joins it), or on the
/// calling thread when `None`: sockets it creates belong to that namespace.
pub fn in_namespace<T: Send + 'static>(
    netns: Option<&Path>,
    open: impl FnOnce() -> Result<T, BackendError> + Send + 'static,
) -> Result<T, BackendError> {
    let Some(path) = netns else {
        return open();
    };
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).map_err(|error| {
            BackendError::Kernel(format!(
                "open network namespace {}: {error}",
                path.display()
            ))
        })?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|error| {
            BackendError::Kernel(format!(
                "join network namespace {}: {error}",
                path.display()
            ))
        })?;
        open()
    })
    .join()
    .map_err(|_| BackendError::Kernel("netns thread panicked".into()))?
}

/// Resolves `--netns` values: a bare name means `/run/netns/NAME` (as `ip netns` creates).
pub fn resolve(name_or_path: &str) -> PathBuf {
    if name_or_path.contains('/') {
        PathBuf::from(name_or_path)
    } else {
        Path::new("/run/netns").join(name_or_path)
    }
}
