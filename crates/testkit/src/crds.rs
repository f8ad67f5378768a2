//! Installing CRDs the way a client must: create each, then wait until the API server reports it
//! Established (served), since a request for a new resource before that is a 404. Used by tests,
//! the demo and the benches alike.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};

/// How long one CRD may take to become Established.
pub const ESTABLISHED_WITHIN: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum CrdInstallError {
    #[error("creating CRD {name}: {source}")]
    Create { name: String, source: kube::Error },
    #[error("watching CRD {name} for Established: {source}")]
    Watch {
        name: String,
        source: kube::runtime::wait::Error,
    },
    #[error("CRD {name} not Established within {ESTABLISHED_WITHIN:?}")]
    NotEstablished { name: String },
}

/// Creates every CRD of `capstan_apis::crds::all()` and waits until each is Established.
pub async fn install_capstan_crds(client: &kube::Client) -> Result<(), CrdInstallError> {
    install_crds(client, capstan_apis::crds::all()).await
}

/// Creates `crds`, then waits until each is Established.
pub async fn install_crds(
    client: &kube::Client,
    crds: impl IntoIterator<Item = CustomResourceDefinition>,
) -> Result<(), CrdInstallError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), &crd)
            .await
            .map_err(|source| CrdInstallError::Create {
                name: name.clone(),
                source,
            })?;
        names.push(name);
    }
    for name in names {
        let established = kube::runtime::wait::await_condition(
            api.clone(),
            &name,
            kube::runtime::conditions::is_crd_established(),
        );
        match tokio::time::timeout(ESTABLISHED_WITHIN, established).await {
            Ok(Ok(_)) => {}
            Ok(Err(source)) => return Err(CrdInstallError::Watch { name, source }),
            Err(_) => return Err(CrdInstallError::NotEstablished { name }),
        }
    }
    Ok(())
}
