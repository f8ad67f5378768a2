//! Reconcile errors, each with a short stable label for metrics and Events.

use capstan_runtime::ErrorLabel;
use machine_driver::DriverError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A guarded write lost a race; the next reconcile re-reads the cache.
    #[error("conflict writing {0}, will re-read")]
    Conflict(String),
    /// A deleting MachineClass is still used.
    #[error("{0}")]
    StillReferred(String),
    #[error("driver: {0}")]
    Driver(#[from] DriverError),
    #[error("encode: {0}")]
    Json(#[from] serde_json::Error),
}

impl ErrorLabel for Error {
    fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(e) => e.metric_label(),
            Error::Conflict(_) => "conflict",
            Error::StillReferred(_) => "still_referred",
            Error::Driver(_) => "driver",
            Error::Json(_) => "encode",
        }
    }
}

/// Maps a 409 to [`Error::Conflict`].
pub fn conflict_aware(name: &str, err: kube::Error) -> Error {
    match err {
        kube::Error::Api(status) if status.code == 409 => Error::Conflict(name.to_owned()),
        other => Error::Kube(other),
    }
}

/// True for a 404 from the API server.
pub fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}
