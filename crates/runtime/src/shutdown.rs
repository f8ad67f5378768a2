//! Graceful shutdown in two signals.
//!
//! The order every binary follows (see [`crate::service::Service::finish`]):
//! 1. **stop accepting new work**: [`Shutdown::trigger`] (SIGTERM/SIGINT, or a lost lease)
//!    cancels [`Shutdown::token`]; controllers stop starting reconciles, `/readyz` turns 503;
//! 2. **finish in-flight work**: running reconciles complete;
//! 3. **release the lease**, so a standby takes over at once instead of after the lease expires;
//! 4. **stop the admin server last** ([`Shutdown::complete`]), so `/livez` keeps answering while
//!    the process drains and the kubelet does not kill it half way.

use tokio_util::sync::CancellationToken;

/// A cloneable shutdown signal: "stop taking new work" (trigger) and "the admin server may stop"
/// (complete). Completing also triggers, so a completed shutdown is always triggered.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    requested: CancellationToken,
    completed: CancellationToken,
}

impl Shutdown {
    /// A shutdown that only fires when [`trigger`](Self::trigger) is called.
    pub fn new() -> Self {
        Self::default()
    }

    /// A shutdown that also fires on SIGTERM or SIGINT. Needs a Tokio runtime.
    pub fn on_signals() -> Result<Self, crate::RuntimeError> {
        let shutdown = Self::new();
        let mut sigterm = signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut sigint = signal(tokio::signal::unix::SignalKind::interrupt())?;
        let on_signal = shutdown.clone();
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = sigterm.recv() => "SIGTERM",
                _ = sigint.recv() => "SIGINT",
                () = on_signal.cancelled() => return,
            };
            tracing::info!(signal = name, "shutdown requested, draining");
            on_signal.trigger();
        });
        Ok(shutdown)
    }

    /// The token cancelled when shutdown is requested (step 1), for tasks that stop on it.
    pub fn token(&self) -> CancellationToken {
        self.requested.clone()
    }

    /// Requests shutdown: stop accepting new work.
    pub fn trigger(&self) {
        self.requested.cancel();
    }

    /// Whether shutdown has been requested.
    pub fn is_triggered(&self) -> bool {
        self.requested.is_cancelled()
    }

    /// Resolves once shutdown is requested.
    pub async fn cancelled(&self) {
        self.requested.cancelled().await;
    }

    /// Marks the drain finished (step 4): the admin server stops.
    pub fn complete(&self) {
        self.requested.cancel();
        self.completed.cancel();
    }

    /// Whether the drain has finished.
    pub fn is_completed(&self) -> bool {
        self.completed.is_cancelled()
    }

    /// Resolves once the drain has finished; the admin server waits on this, not on
    /// [`cancelled`](Self::cancelled).
    pub async fn completed(&self) {
        self.completed.cancelled().await;
    }
}

fn signal(
    kind: tokio::signal::unix::SignalKind,
) -> Result<tokio::signal::unix::Signal, crate::RuntimeError> {
    tokio::signal::unix::signal(kind).map_err(crate::RuntimeError::Signals)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn trigger_is_seen_by_clones_and_tokens() {
        let shutdown = Shutdown::new();
        let clone = shutdown.clone();
        let token = shutdown.token();
        assert!(!clone.is_triggered());
        assert!(!token.is_cancelled());
        shutdown.trigger();
        assert!(clone.is_triggered());
        assert!(token.is_cancelled());
        clone.cancelled().await;
        // Triggering is not completing: the admin server keeps running while draining.
        assert!(!clone.is_completed());
    }

    #[tokio::test]
    async fn complete_implies_triggered() {
        let shutdown = Shutdown::new();
        shutdown.complete();
        assert!(shutdown.is_triggered());
        assert!(shutdown.is_completed());
        shutdown.completed().await;
    }

    #[tokio::test]
    async fn sigterm_triggers_signal_shutdown() {
        let shutdown = Shutdown::on_signals().expect("signal handlers install");
        // Raise SIGTERM on this very process: tokio's handler replaces the default action.
        let status = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
        tokio::time::timeout(std::time::Duration::from_secs(5), shutdown.cancelled())
            .await
            .expect("SIGTERM triggers shutdown");
        assert!(!shutdown.is_completed());
    }
}
