//! Pins the full gRPC method paths: the generated clients must send, and the
//! generated servers must route, exactly `/router.SliceRouterSidecarService/<Rpc>`
//! and `/sidecar.GwSidecarService/<Rpc>`, as KubeSlice does.

use std::sync::{Arc, Mutex};

use capstan_proto::machine_driver::machine_driver_server::MachineDriverServer;
use capstan_proto::router::{
    self,
    slice_router_sidecar_service_client::SliceRouterSidecarServiceClient,
    slice_router_sidecar_service_server::{
        SliceRouterSidecarService, SliceRouterSidecarServiceServer,
    },
};
use capstan_proto::sidecar::{
    self,
    gw_sidecar_service_client::GwSidecarServiceClient,
    gw_sidecar_service_server::{GwSidecarService, GwSidecarServiceServer},
};
use tonic::codegen::{Context, Poll, Service, http};
use tonic::server::NamedService;
use tonic::{Request, Response, Status};

/// Forwards HTTP requests to an in-process generated server, recording each path.
#[derive(Clone)]
struct PathRecorder<S> {
    inner: S,
    paths: Arc<Mutex<Vec<String>>>,
}

impl<S, B> Service<http::Request<B>> for PathRecorder<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        self.paths
            .lock()
            .expect("lock")
            .push(req.uri().path().to_string());
        self.inner.call(req)
    }
}

/// Each RPC answers with its own name so that misrouting is visible.
struct NamingRouter;

#[tonic::async_trait]
impl SliceRouterSidecarService for NamingRouter {
    async fn update_slice_gw_connection_context(
        &self,
        _: Request<router::SliceGwConContext>,
    ) -> Result<Response<router::SidecarResponse>, Status> {
        Ok(Response::new(router::SidecarResponse {
            status_msg: "UpdateSliceGwConnectionContext".into(),
        }))
    }
    async fn get_slice_router_client_connection_info(
        &self,
        _: Request<()>,
    ) -> Result<Response<router::ClientConnectionInfo>, Status> {
        Ok(Response::new(router::ClientConnectionInfo {
            connection: vec![router::ConnectionInfo {
                pod_name: "GetSliceRouterClientConnectionInfo".into(),
                ..Default::default()
            }],
        }))
    }
    async fn get_route_in_kernel(
        &self,
        _: Request<router::VerifyRouteAddRequest>,
    ) -> Result<Response<router::VerifyRouteAddResponse>, Status> {
        Ok(Response::new(router::VerifyRouteAddResponse {
            is_route_present: true,
        }))
    }
    async fn update_ecmp_routes(
        &self,
        _: Request<router::EcmpUpdateInfo>,
    ) -> Result<Response<router::SidecarResponse>, Status> {
        Ok(Response::new(router::SidecarResponse {
            status_msg: "UpdateEcmpRoutes".into(),
        }))
    }
}

struct NamingGw;

#[tonic::async_trait]
impl GwSidecarService for NamingGw {
    async fn get_status(&self, _: Request<()>) -> Result<Response<sidecar::GwPodStatus>, Status> {
        Ok(Response::new(sidecar::GwPodStatus {
            gateway_pod_name: "GetStatus".into(),
            ..Default::default()
        }))
    }
    async fn get_slice_gw_remote_pod_name(
        &self,
        _: Request<sidecar::RemoteGwVpnIp>,
    ) -> Result<Response<sidecar::GwPodStatus>, Status> {
        Ok(Response::new(sidecar::GwPodStatus {
            gateway_pod_name: "GetSliceGwRemotePodName".into(),
            ..Default::default()
        }))
    }
    async fn update_connection_context(
        &self,
        _: Request<sidecar::SliceGwConnectionContext>,
    ) -> Result<Response<sidecar::SidecarResponse>, Status> {
        Ok(Response::new(sidecar::SidecarResponse {
            status_msg: "UpdateConnectionContext".into(),
        }))
    }
    async fn update_slice_qos_profile(
        &self,
        _: Request<sidecar::SliceQosProfile>,
    ) -> Result<Response<sidecar::SidecarResponse>, Status> {
        Ok(Response::new(sidecar::SidecarResponse {
            status_msg: "UpdateSliceQosProfile".into(),
        }))
    }
}

#[test]
fn service_names() {
    assert_eq!(
        <SliceRouterSidecarServiceServer<NamingRouter> as NamedService>::NAME,
        "router.SliceRouterSidecarService"
    );
    assert_eq!(
        <GwSidecarServiceServer<NamingGw> as NamedService>::NAME,
        "sidecar.GwSidecarService"
    );
    assert_eq!(
        <MachineDriverServer<()> as NamedService>::NAME,
        "capstan.machine.v1.MachineDriver"
    );
}

#[tokio::test]
async fn router_method_paths() -> Result<(), Status> {
    let paths = Arc::new(Mutex::new(Vec::new()));
    let transport = PathRecorder {
        inner: SliceRouterSidecarServiceServer::new(NamingRouter),
        paths: paths.clone(),
    };
    let mut client = SliceRouterSidecarServiceClient::new(transport);

    let reply = client
        .update_slice_gw_connection_context(router::SliceGwConContext::default())
        .await?;
    assert_eq!(
        reply.into_inner().status_msg,
        "UpdateSliceGwConnectionContext"
    );
    let reply = client.get_slice_router_client_connection_info(()).await?;
    assert_eq!(
        reply.into_inner().connection[0].pod_name,
        "GetSliceRouterClientConnectionInfo"
    );
    assert!(
        client
            .get_route_in_kernel(router::VerifyRouteAddRequest::default())
            .await?
            .into_inner()
            .is_route_present
    );
    let reply = client
        .update_ecmp_routes(router::EcmpUpdateInfo::default())
        .await?;
    assert_eq!(reply.into_inner().status_msg, "UpdateEcmpRoutes");

    assert_eq!(
        *paths.lock().expect("lock"),
        [
            "/router.SliceRouterSidecarService/UpdateSliceGwConnectionContext",
            "/router.SliceRouterSidecarService/GetSliceRouterClientConnectionInfo",
            "/router.SliceRouterSidecarService/GetRouteInKernel",
            "/router.SliceRouterSidecarService/UpdateEcmpRoutes",
        ]
    );
    Ok(())
}

#[tokio::test]
async fn gw_method_paths() -> Result<(), Status> {
    let paths = Arc::new(Mutex::new(Vec::new()));
    let transport = PathRecorder {
        inner: GwSidecarServiceServer::new(NamingGw),
        paths: paths.clone(),
    };
    let mut client = GwSidecarServiceClient::new(transport);

    assert_eq!(
        client.get_status(()).await?.into_inner().gateway_pod_name,
        "GetStatus"
    );
    let reply = client
        .get_slice_gw_remote_pod_name(sidecar::RemoteGwVpnIp::default())
        .await?;
    assert_eq!(
        reply.into_inner().gateway_pod_name,
        "GetSliceGwRemotePodName"
    );
    let reply = client
        .update_connection_context(sidecar::SliceGwConnectionContext::default())
        .await?;
    assert_eq!(reply.into_inner().status_msg, "UpdateConnectionContext");
    let reply = client
        .update_slice_qos_profile(sidecar::SliceQosProfile::default())
        .await?;
    assert_eq!(reply.into_inner().status_msg, "UpdateSliceQosProfile");

    assert_eq!(
        *paths.lock().expect("lock"),
        [
            "/sidecar.GwSidecarService/GetStatus",
            "/sidecar.GwSidecarService/GetSliceGwRemotePodName",
            "/sidecar.GwSidecarService/UpdateConnectionContext",
            "/sidecar.GwSidecarService/UpdateSliceQosProfile",
        ]
    );
    Ok(())
}

#[tokio::test]
async fn server_rejects_a_wrong_path_as_unimplemented() {
    // The server routes by exact path: a near miss (wrong package) is Unimplemented.
    let server = SliceRouterSidecarServiceServer::new(NamingRouter);
    let mut grpc = tonic::client::Grpc::new(server);
    let codec =
        tonic_prost::ProstCodec::<router::EcmpUpdateInfo, router::SidecarResponse>::default();
    let path =
        http::uri::PathAndQuery::from_static("/sidecar.SliceRouterSidecarService/UpdateEcmpRoutes");
    let err = grpc
        .unary(Request::new(router::EcmpUpdateInfo::default()), path, codec)
        .await
        .expect_err("wrong package must not route");
    assert_eq!(err.code(), tonic::Code::Unimplemented);
}
