//! The driver over gRPC (`capstan.machine.v1.MachineDriver`): [`GrpcDriver`] calls a remote
//! provider, [`DriverService`] serves any [`Driver`]. Objects travel as JSON, errors as gRPC
//! status codes with MCM's meaning (`Uninitialized` marked by a trailer, see
//! [`capstan_proto::machine_driver::McmCode`]). Both sides trace each call (a `grpc` span of kind
//! client / server, the trace context carried in `traceparent`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use capstan_apis::machine::Code;
use capstan_proto::machine_driver as pb;
use capstan_proto::machine_driver::McmCode;
use capstan_proto::machine_driver::machine_driver_client::MachineDriverClient;
use capstan_proto::machine_driver::machine_driver_server::{MachineDriver, MachineDriverServer};
use capstan_runtime::http_trace::{TraceLayer, Traced};
use k8s_openapi::api::core::v1::{NodeAddress, PersistentVolumeSpec};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tower::Layer as _;

use crate::{
    Driver, DriverError, DriverFuture, ListMachinesRequest, MachineInfo, MachineRequest,
    MachineStatusInfo,
};

fn to_status(err: DriverError) -> Status {
    McmCode::from_i32(err.code.number() as i32)
        .unwrap_or(McmCode::Unknown)
        .into_status(err.message)
}

fn from_status(status: &Status) -> DriverError {
    let number = u32::try_from(McmCode::of_status(status).as_i32()).unwrap_or(2);
    DriverError::new(
        Code::from_number(number).unwrap_or(Code::Unknown),
        status.message(),
    )
}

fn invalid(what: &str, err: serde_json::Error) -> Status {
    Status::invalid_argument(format!("{what}: {err}"))
}

fn addresses_to_pb(list: Vec<NodeAddress>) -> Vec<pb::NodeAddress> {
    list.into_iter()
        .map(|a| pb::NodeAddress {
            r#type: a.type_,
            address: a.address,
        })
        .collect()
}

fn addresses_from_pb(list: Vec<pb::NodeAddress>) -> Vec<NodeAddress> {
    list.into_iter()
        .map(|a| NodeAddress {
            type_: a.r#type,
            address: a.address,
        })
        .collect()
}

fn decode_request(req: pb::MachineRequest) -> Result<MachineRequest, Status> {
    Ok(MachineRequest {
        machine: serde_json::from_str(&req.machine_json).map_err(|e| invalid("machine_json", e))?,
        class: serde_json::from_str(&req.machine_class_json)
            .map_err(|e| invalid("machine_class_json", e))?,
        secret_data: req.secret_data.into_iter().collect(),
    })
}

fn encode_request(req: &MachineRequest) -> Result<pb::MachineRequest, DriverError> {
    let enc =
        |e: serde_json::Error| DriverError::new(Code::Internal, format!("encode request: {e}"));
    Ok(pb::MachineRequest {
        machine_json: serde_json::to_string(&req.machine).map_err(enc)?,
        machine_class_json: serde_json::to_string(&req.class).map_err(enc)?,
        secret_data: secret_map(&req.secret_data),
    })
}

fn secret_map(data: &BTreeMap<String, Vec<u8>>) -> HashMap<String, Vec<u8>> {
    data.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Serves a [`Driver`] as `capstan.machine.v1.MachineDriver`.
pub struct DriverService<D> {
    driver: Arc<D>,
}

impl<D: Driver> DriverService<D> {
    pub fn new(driver: Arc<D>) -> Self {
        Self { driver }
    }

    /// The tonic service, ready for `Server::builder().add_service(..)`.
    pub fn into_server(self) -> MachineDriverServer<Self> {
        MachineDriverServer::new(self)
    }
}

#[tonic::async_trait]
impl<D: Driver> MachineDriver for DriverService<D> {
    async fn create_machine(
        &self,
        request: Request<pb::MachineRequest>,
    ) -> Result<Response<pb::CreateMachineResponse>, Status> {
        let req = decode_request(request.into_inner())?;
        let info = self.driver.create_machine(&req).await.map_err(to_status)?;
        Ok(Response::new(pb::CreateMachineResponse {
            provider_id: info.provider_id,
            node_name: info.node_name,
            last_known_state: info.last_known_state,
            addresses: addresses_to_pb(info.addresses),
        }))
    }

    async fn initialize_machine(
        &self,
        request: Request<pb::MachineRequest>,
    ) -> Result<Response<pb::InitializeMachineResponse>, Status> {
        let req = decode_request(request.into_inner())?;
        let info = self
            .driver
            .initialize_machine(&req)
            .await
            .map_err(to_status)?;
        Ok(Response::new(pb::InitializeMachineResponse {
            provider_id: info.provider_id,
            node_name: info.node_name,
            last_known_state: info.last_known_state,
            addresses: addresses_to_pb(info.addresses),
        }))
    }

    async fn delete_machine(
        &self,
        request: Request<pb::MachineRequest>,
    ) -> Result<Response<pb::DeleteMachineResponse>, Status> {
        let req = decode_request(request.into_inner())?;
        let state = self.driver.delete_machine(&req).await.map_err(to_status)?;
        Ok(Response::new(pb::DeleteMachineResponse {
            last_known_state: state,
        }))
    }

    async fn get_machine_status(
        &self,
        request: Request<pb::MachineRequest>,
    ) -> Result<Response<pb::GetMachineStatusResponse>, Status> {
        let req = decode_request(request.into_inner())?;
        let info = self
            .driver
            .get_machine_status(&req)
            .await
            .map_err(to_status)?;
        Ok(Response::new(pb::GetMachineStatusResponse {
            provider_id: info.provider_id,
            node_name: info.node_name,
            addresses: addresses_to_pb(info.addresses),
        }))
    }

    async fn list_machines(
        &self,
        request: Request<pb::ListMachinesRequest>,
    ) -> Result<Response<pb::ListMachinesResponse>, Status> {
        let req = request.into_inner();
        let list = ListMachinesRequest {
            class: serde_json::from_str(&req.machine_class_json)
                .map_err(|e| invalid("machine_class_json", e))?,
            secret_data: req.secret_data.into_iter().collect(),
        };
        let machines = self.driver.list_machines(&list).await.map_err(to_status)?;
        Ok(Response::new(pb::ListMachinesResponse {
            machine_list: machines.into_iter().collect(),
        }))
    }

    async fn get_volume_i_ds(
        &self,
        request: Request<pb::GetVolumeIDsRequest>,
    ) -> Result<Response<pb::GetVolumeIDsResponse>, Status> {
        let specs = request
            .into_inner()
            .pv_specs_json
            .iter()
            .map(|s| serde_json::from_str::<PersistentVolumeSpec>(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid("pv_specs_json", e))?;
        let ids = self
            .driver
            .get_volume_ids(&specs)
            .await
            .map_err(to_status)?;
        Ok(Response::new(pb::GetVolumeIDsResponse { volume_ids: ids }))
    }
}

/// Serves `driver` on `listener` until `shutdown` resolves.
pub async fn serve<D: Driver>(
    driver: Arc<D>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tonic::transport::Server::builder()
        .layer(TraceLayer::grpc_server())
        .add_service(DriverService::new(driver).into_server())
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// A [`Driver`] that calls a remote `capstan.machine.v1.MachineDriver`.
#[derive(Clone, Debug)]
pub struct GrpcDriver {
    client: MachineDriverClient<Traced<Channel>>,
}

impl GrpcDriver {
    /// Connects lazily to `endpoint` (`http://host:port`): the first call dials, and a provider
    /// that is down shows up as `Unavailable` on each call rather than failing start-up.
    pub fn connect_lazy(endpoint: &str) -> Result<Self, InvalidEndpoint> {
        let endpoint = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
            .map_err(|_| InvalidEndpoint(endpoint.to_owned()))?;
        Ok(Self {
            client: MachineDriverClient::new(
                TraceLayer::grpc_client().layer(endpoint.connect_lazy()),
            ),
        })
    }

    /// The `http://host:port` endpoint for a `--driver grpc://host:port` value.
    pub fn endpoint_of(flag: &str) -> Option<String> {
        let rest = flag.strip_prefix("grpc://")?;
        (!rest.is_empty() && !rest.contains('/')).then(|| format!("http://{rest}"))
    }
}

/// A driver endpoint that is not a valid URI.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid driver endpoint {0:?}")]
pub struct InvalidEndpoint(pub String);

impl Driver for GrpcDriver {
    fn create_machine<'a>(&'a self, request: &'a MachineRequest) -> DriverFuture<'a, MachineInfo> {
        Box::pin(async move {
            let req = encode_request(request)?;
            let resp = self
                .client
                .clone()
                .create_machine(req)
                .await
                .map_err(|s| from_status(&s))?
                .into_inner();
            Ok(MachineInfo {
                provider_id: resp.provider_id,
                node_name: resp.node_name,
                last_known_state: resp.last_known_state,
                addresses: addresses_from_pb(resp.addresses),
            })
        })
    }

    fn initialize_machine<'a>(
        &'a self,
        request: &'a MachineRequest,
    ) -> DriverFuture<'a, MachineInfo> {
        Box::pin(async move {
            let req = encode_request(request)?;
            let resp = self
                .client
                .clone()
                .initialize_machine(req)
                .await
                .map_err(|s| from_status(&s))?
                .into_inner();
            Ok(MachineInfo {
                provider_id: resp.provider_id,
                node_name: resp.node_name,
                last_known_state: resp.last_known_state,
                addresses: addresses_from_pb(resp.addresses),
            })
        })
    }

    fn delete_machine<'a>(&'a self, request: &'a MachineRequest) -> DriverFuture<'a, String> {
        Box::pin(async move {
            let req = encode_request(request)?;
            let resp = self
                .client
                .clone()
                .delete_machine(req)
                .await
                .map_err(|s| from_status(&s))?
                .into_inner();
            Ok(resp.last_known_state)
        })
    }

    fn get_machine_status<'a>(
        &'a self,
        request: &'a MachineRequest,
    ) -> DriverFuture<'a, MachineStatusInfo> {
        Box::pin(async move {
            let req = encode_request(request)?;
            let resp = self
                .client
                .clone()
                .get_machine_status(req)
                .await
                .map_err(|s| from_status(&s))?
                .into_inner();
            Ok(MachineStatusInfo {
                provider_id: resp.provider_id,
                node_name: resp.node_name,
                addresses: addresses_from_pb(resp.addresses),
            })
        })
    }

    fn list_machines<'a>(
        &'a self,
        request: &'a ListMachinesRequest,
    ) -> DriverFuture<'a, BTreeMap<String, String>> {
        Box::pin(async move {
            let class = serde_json::to_string(&request.class)
                .map_err(|e| DriverError::new(Code::Internal, format!("encode class: {e}")))?;
            let req = pb::ListMachinesRequest {
                machine_class_json: class,
                secret_data: secret_map(&request.secret_data),
            };
            let resp = self
                .client
                .clone()
                .list_machines(req)
                .await
                .map_err(|s| from_status(&s))?
                .into_inner();
            Ok(resp.machine_list.into_iter().collect())
        })
    }

    fn get_volume_ids<'a>(
        &'a self,
        specs: &'a [PersistentVolumeSpec],
    ) -> DriverFuture<'a, Vec<String>> {
        Box::pin(async move {
            let pv_specs_json = specs
                .iter()
                .map(serde_json::to_string)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| DriverError::new(Code::Internal, format!("encode pv spec: {e}")))?;
            let resp = self
                .client
                .clone()
                .get_volume_i_ds(pb::GetVolumeIDsRequest { pv_specs_json })
                .await
                .map_err(|s| from_status(&s))?
                .into_inner();
            Ok(resp.volume_ids)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_flag_maps_to_http_endpoint() {
        assert_eq!(
            GrpcDriver::endpoint_of("grpc://127.0.0.1:9000").as_deref(),
            Some("http://127.0.0.1:9000")
        );
        assert_eq!(
            GrpcDriver::endpoint_of("grpc://driver.svc:443").as_deref(),
            Some("http://driver.svc:443")
        );
        assert_eq!(GrpcDriver::endpoint_of("grpc://"), None);
        assert_eq!(GrpcDriver::endpoint_of("sim"), None);
    }

    #[test]
    fn every_code_survives_the_status_round_trip() {
        for code in Code::ALL {
            if code == Code::Ok {
                continue;
            }
            let back = from_status(&to_status(DriverError::new(code, "boom")));
            assert_eq!(back, DriverError::new(code, "boom"), "{code}");
        }
    }
}
