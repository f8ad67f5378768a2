//! How a failed `CreateMachine` (or status lookup during creation) moves the Machine: retry
//! period, phase `CrashLoopBackOff` or `Failed`, and the lastOperation MCM tooling reads.

use std::time::Duration;

use capstan_apis::machine::{Code, MachineOperationType, MachinePhase, MachineState};

use crate::Timestamp;
use crate::status::{Operation, StatusChange};

/// Retry periods (MCM's conflict/short/medium/long retries, all configurable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPeriods {
    pub conflict: Duration,
    pub short: Duration,
    pub medium: Duration,
    pub long: Duration,
    /// Retry after a `ResourceExhausted` driver error (quota, capacity).
    pub resource_exhausted: Duration,
}

impl Default for RetryPeriods {
    fn default() -> Self {
        Self {
            conflict: Duration::from_millis(200),
            short: Duration::from_secs(5),
            medium: Duration::from_secs(3 * 60),
            long: Duration::from_secs(10 * 60),
            resource_exhausted: Duration::from_secs(3 * 60),
        }
    }
}

/// True for codes MCM treats as transient (retried after the short period).
pub fn is_transient(code: Code) -> bool {
    matches!(
        code,
        Code::Unknown | Code::DeadlineExceeded | Code::Aborted | Code::Unavailable
    )
}

/// Retry period after a driver error with `code`.
pub fn retry_after(code: Code, periods: &RetryPeriods) -> Duration {
    match code {
        c if is_transient(c) => periods.short,
        Code::ResourceExhausted => periods.resource_exhausted,
        _ => periods.medium,
    }
}

/// The outcome of a failed creation attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreationFailure {
    pub status: StatusChange,
    pub retry_after: Duration,
}

/// Classifies a creation error: `CrashLoopBackOff`, or `Failed` once `creation_timeout` has passed
/// since the Machine was created; lastOperation "Cloud provider message - <err>" with the code name.
pub fn creation_failure(
    code: Code,
    message: &str,
    created: Timestamp,
    now: Timestamp,
    creation_timeout: Duration,
    periods: &RetryPeriods,
) -> CreationFailure {
    let phase = if elapsed(created, now) > creation_timeout {
        MachinePhase::Failed
    } else {
        MachinePhase::CrashLoopBackOff
    };
    let operation = Operation::new(
        format!("Cloud provider message - {message}"),
        MachineState::Failed,
        MachineOperationType::Create,
    )
    .with_code(code.name());
    CreationFailure {
        status: StatusChange::phase(phase).with_operation(operation),
        retry_after: retry_after(code, periods),
    }
}

/// Time from `since` to `now`, zero if `now` is earlier; saturates past `u64` nanoseconds (a
/// timestamp centuries off must not look like no time at all).
pub fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    let nanos = now.as_nanosecond().saturating_sub(since.as_nanosecond());
    if nanos <= 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("valid")
    }

    #[test]
    fn retry_periods_follow_the_code() {
        let p = RetryPeriods {
            resource_exhausted: Duration::from_secs(42),
            ..RetryPeriods::default()
        };
        for code in [
            Code::Unknown,
            Code::DeadlineExceeded,
            Code::Aborted,
            Code::Unavailable,
        ] {
            assert_eq!(retry_after(code, &p), Duration::from_secs(5), "{code}");
        }
        assert_eq!(
            retry_after(Code::ResourceExhausted, &p),
            Duration::from_secs(42)
        );
        for code in [
            Code::InvalidArgument,
            Code::Internal,
            Code::PermissionDenied,
            Code::Uninitialized,
        ] {
            assert_eq!(retry_after(code, &p), Duration::from_secs(180), "{code}");
        }
    }

    #[test]
    fn crash_loop_then_failed_after_creation_timeout() {
        let p = RetryPeriods::default();
        let timeout = Duration::from_secs(20 * 60);
        let early = creation_failure(
            Code::ResourceExhausted,
            "quota exceeded",
            at(0),
            at(60),
            timeout,
            &p,
        );
        assert_eq!(early.status.phase, Some(MachinePhase::CrashLoopBackOff));
        let op = early.status.operation.as_ref().expect("operation");
        assert_eq!(op.description, "Cloud provider message - quota exceeded");
        assert_eq!(op.error_code.as_deref(), Some("ResourceExhausted"));
        assert_eq!(op.state, MachineState::Failed);
        assert_eq!(op.kind, MachineOperationType::Create);
        assert_eq!(early.retry_after, p.resource_exhausted);

        let late = creation_failure(
            Code::Unavailable,
            "down",
            at(0),
            at(20 * 60 + 1),
            timeout,
            &p,
        );
        assert_eq!(late.status.phase, Some(MachinePhase::Failed));
        assert_eq!(late.retry_after, p.short);
        // Exactly at the timeout it is not failed yet.
        let edge = creation_failure(Code::Internal, "x", at(0), at(20 * 60), timeout, &p);
        assert_eq!(edge.status.phase, Some(MachinePhase::CrashLoopBackOff));
    }

    #[test]
    fn elapsed_never_goes_negative() {
        assert_eq!(elapsed(at(10), at(5)), Duration::ZERO);
        assert_eq!(elapsed(at(5), at(10)), Duration::from_secs(5));
    }
}
