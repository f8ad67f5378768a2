//! Errors a backend (kernel or memory) reports, and how they reach gRPC callers.

use tonic::Status;

/// A backend operation that failed after validation succeeded.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The kernel refused or failed the change (reported as `Internal` with the reason).
    #[error("kernel: {0}")]
    Kernel(String),
    /// The kernel refused a change with EPERM: the process lacks CAP_NET_ADMIN in the network
    /// namespace (the start-up probe, [`crate::netns::Netlink::require_net_admin`]).
    #[error(
        "the kernel backend needs CAP_NET_ADMIN in its network namespace, and netlink refused a \
         change with EPERM (Operation not permitted; running as {credentials}). Run the sidecar \
         as UID 0 with only the NET_ADMIN capability added (a non-root process loses added \
         capabilities at execve, and no_new_privs ignores file capabilities: the chart does \
         this for backend kernel), or use --backend memory"
    )]
    MissingNetAdmin {
        /// The process's uid and effective capability mask, as /proc/self/status shows them.
        credentials: String,
    },
    /// The backend cannot do this at all (reported as `Unimplemented`).
    #[error("{0}")]
    Unsupported(String),
    /// The backend cannot answer now; asking again later may work (reported as `Unavailable`).
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl From<rtnetlink::Error> for BackendError {
    fn from(error: rtnetlink::Error) -> Self {
        BackendError::Kernel(error.to_string())
    }
}

impl From<BackendError> for Status {
    fn from(error: BackendError) -> Self {
        match error {
            BackendError::Unsupported(reason) => Status::unimplemented(reason),
            BackendError::Unavailable(reason) => Status::unavailable(reason),
            other => Status::internal(other.to_string()),
        }
    }
}

/// An invalid request, reported as `InvalidArgument` with a fixed, client-visible message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidArgument(pub &'static str);

impl From<InvalidArgument> for Status {
    fn from(error: InvalidArgument) -> Self {
        Status::invalid_argument(error.0)
    }
}
