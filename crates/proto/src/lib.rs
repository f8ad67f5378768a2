//! Generated gRPC code for Capstan's wire contracts in `proto/`.
//!
//! - [`router`]: KubeSlice's `router.SliceRouterSidecarService` (router sidecar).
//! - [`sidecar`]: KubeSlice's `sidecar.GwSidecarService` (gateway sidecar).
//! - [`machine_driver`]: `capstan.machine.v1.MachineDriver`, MCM's provider
//!   driver interface over gRPC, plus [`machine_driver::McmCode`] to carry
//!   MCM's `Uninitialized` code across the wire.
//!
//! Clients and servers are generated for every service; `google.protobuf.Empty`
//! maps to `()`.

/// Slice router sidecar (`package router;`).
#[allow(clippy::all, missing_docs)]
pub mod router {
    tonic::include_proto!("router");
}

/// Slice gateway sidecar (`package sidecar;`).
#[allow(clippy::all, missing_docs)]
pub mod sidecar {
    tonic::include_proto!("sidecar");
}

/// Machine driver (`package capstan.machine.v1;`).
pub mod machine_driver {
    #[allow(clippy::all, missing_docs)]
    mod generated {
        tonic::include_proto!("capstan.machine.v1");
    }
    pub use generated::*;

    mod mcm_code;
    pub use mcm_code::{MCM_CODE_METADATA_KEY, McmCode};
}
