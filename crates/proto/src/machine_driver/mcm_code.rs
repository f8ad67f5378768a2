//! MCM's driver error codes and how they travel over gRPC.
//!
//! MCM's codes are the gRPC codes 0..=16 plus `Uninitialized` (17). gRPC
//! libraries (tonic's `Code::from(17)` included) read unknown numbers as
//! `UNKNOWN`, so 17 is sent as status code `UNKNOWN` with the ASCII metadata
//! entry `capstan-mcm-code: 17`; every other code is sent as itself.

use std::fmt;

use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

/// Metadata key (sent as a trailer) that carries an MCM code gRPC cannot express.
pub const MCM_CODE_METADATA_KEY: &str = "capstan-mcm-code";

/// An MCM driver status code (`github.com/gardener/machine-controller-manager/pkg/util/provider/machinecodes/codes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum McmCode {
    Ok,
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
    /// VM initialization failed (MCM only, number 17).
    Uninitialized,
}

const ALL: [McmCode; 18] = [
    McmCode::Ok,
    McmCode::Canceled,
    McmCode::Unknown,
    McmCode::InvalidArgument,
    McmCode::DeadlineExceeded,
    McmCode::NotFound,
    McmCode::AlreadyExists,
    McmCode::PermissionDenied,
    McmCode::ResourceExhausted,
    McmCode::FailedPrecondition,
    McmCode::Aborted,
    McmCode::OutOfRange,
    McmCode::Unimplemented,
    McmCode::Internal,
    McmCode::Unavailable,
    McmCode::DataLoss,
    McmCode::Unauthenticated,
    McmCode::Uninitialized,
];

impl McmCode {
    /// Every code, in numeric order.
    pub const ALL: [McmCode; 18] = ALL;

    /// The numeric value MCM uses.
    pub fn as_i32(self) -> i32 {
        match self {
            McmCode::Uninitialized => 17,
            other => other.grpc_code() as i32,
        }
    }

    /// The code with this number, if MCM defines one.
    pub fn from_i32(value: i32) -> Option<Self> {
        usize::try_from(value)
            .ok()
            .and_then(|i| ALL.get(i).copied())
    }

    /// MCM's name of the code (Go `codes.Code.String()`), used as `lastOperation.errorCode`.
    pub fn name(self) -> &'static str {
        match self {
            McmCode::Ok => "OK",
            McmCode::Canceled => "Canceled",
            McmCode::Unknown => "Unknown",
            McmCode::InvalidArgument => "InvalidArgument",
            McmCode::DeadlineExceeded => "DeadlineExceeded",
            McmCode::NotFound => "NotFound",
            McmCode::AlreadyExists => "AlreadyExists",
            McmCode::PermissionDenied => "PermissionDenied",
            McmCode::ResourceExhausted => "ResourceExhausted",
            McmCode::FailedPrecondition => "FailedPrecondition",
            McmCode::Aborted => "Aborted",
            McmCode::OutOfRange => "OutOfRange",
            McmCode::Unimplemented => "Unimplemented",
            McmCode::Internal => "Internal",
            McmCode::Unavailable => "Unavailable",
            McmCode::DataLoss => "DataLoss",
            McmCode::Unauthenticated => "Unauthenticated",
            McmCode::Uninitialized => "Uninitialized",
        }
    }

    /// The gRPC status code this travels as (`Unknown` for `Uninitialized`).
    pub fn grpc_code(self) -> Code {
        match self {
            McmCode::Ok => Code::Ok,
            McmCode::Canceled => Code::Cancelled,
            McmCode::Unknown | McmCode::Uninitialized => Code::Unknown,
            McmCode::InvalidArgument => Code::InvalidArgument,
            McmCode::DeadlineExceeded => Code::DeadlineExceeded,
            McmCode::NotFound => Code::NotFound,
            McmCode::AlreadyExists => Code::AlreadyExists,
            McmCode::PermissionDenied => Code::PermissionDenied,
            McmCode::ResourceExhausted => Code::ResourceExhausted,
            McmCode::FailedPrecondition => Code::FailedPrecondition,
            McmCode::Aborted => Code::Aborted,
            McmCode::OutOfRange => Code::OutOfRange,
            McmCode::Unimplemented => Code::Unimplemented,
            McmCode::Internal => Code::Internal,
            McmCode::Unavailable => Code::Unavailable,
            McmCode::DataLoss => Code::DataLoss,
            McmCode::Unauthenticated => Code::Unauthenticated,
        }
    }

    /// A gRPC status carrying this code (with the metadata marker for `Uninitialized`).
    pub fn into_status(self, message: impl Into<String>) -> Status {
        let mut metadata = MetadataMap::new();
        if self == McmCode::Uninitialized {
            metadata.insert(MCM_CODE_METADATA_KEY, MetadataValue::from(self.as_i32()));
        }
        Status::with_metadata(self.grpc_code(), message, metadata)
    }

    /// The MCM code a received status stands for.
    pub fn of_status(status: &Status) -> Self {
        let marked = status
            .metadata()
            .get(MCM_CODE_METADATA_KEY)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| text.trim().parse::<i32>().ok())
            .and_then(McmCode::from_i32);
        marked.unwrap_or_else(|| McmCode::from(status.code()))
    }
}

impl From<Code> for McmCode {
    fn from(code: Code) -> Self {
        // tonic's Code is numbered like gRPC (0..=16); anything else reads as Unknown.
        McmCode::from_i32(code as i32)
            .filter(|c| *c != McmCode::Uninitialized)
            .unwrap_or(McmCode::Unknown)
    }
}

impl fmt::Display for McmCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_follow_grpc_and_uninitialized_is_17() {
        for (i, code) in McmCode::ALL.iter().enumerate() {
            assert_eq!(code.as_i32(), i as i32, "{code}");
            assert_eq!(McmCode::from_i32(i as i32), Some(*code));
        }
        assert_eq!(McmCode::from_i32(18), None);
        assert_eq!(McmCode::from_i32(-1), None);
        assert_eq!(McmCode::Uninitialized.as_i32(), 17);
    }

    #[test]
    fn uninitialized_travels_as_unknown_with_marker() {
        let status = McmCode::Uninitialized.into_status("boot script failed");
        assert_eq!(status.code(), Code::Unknown);
        assert_eq!(status.message(), "boot script failed");
        assert_eq!(
            status
                .metadata()
                .get(MCM_CODE_METADATA_KEY)
                .and_then(|v| v.to_str().ok()),
            Some("17")
        );
        assert_eq!(McmCode::of_status(&status), McmCode::Uninitialized);
    }

    #[test]
    fn plain_codes_round_trip_without_marker() {
        for code in McmCode::ALL {
            if code == McmCode::Uninitialized {
                continue;
            }
            let status = code.into_status("x");
            assert!(status.metadata().get(MCM_CODE_METADATA_KEY).is_none());
            assert_eq!(McmCode::of_status(&status), code, "{code}");
        }
        // A plain Unknown from a foreign driver stays Unknown.
        assert_eq!(
            McmCode::of_status(&Status::unknown("boom")),
            McmCode::Unknown
        );
    }

    #[test]
    fn names_match_mcm() {
        assert_eq!(McmCode::ResourceExhausted.to_string(), "ResourceExhausted");
        assert_eq!(McmCode::Ok.name(), "OK");
        assert_eq!(McmCode::Canceled.name(), "Canceled");
        assert_eq!(McmCode::Uninitialized.name(), "Uninitialized");
    }
}
