//! The controller's own `<config>-last-good` ConfigMap beside the user's: the text of each key in
//! force, read at start and written only when it changes, so that a key with a typo keeps its last
//! good value across a restart. The user's ConfigMap is never written.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nodeslo_core::ConfigProblem;
use nodeslo_core::last_good::{last_good_name, texts_in_force};
use serde_json::{Value, json};

/// Reads and writes the last-good ConfigMap; remembers what it holds to skip unchanged writes.
pub struct LastGoodStore {
    api: Api<ConfigMap>,
    name: String,
    manager: String,
    /// What the ConfigMap holds (`None`: not known yet, so the next save writes).
    stored: Mutex<Option<BTreeMap<String, String>>>,
}

impl LastGoodStore {
    pub fn new(client: Client, namespace: &str, config_name: &str, manager: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: last_good_name(config_name),
            manager: manager.to_owned(),
            stored: Mutex::new(None),
        }
    }

    /// The stored texts (empty when there are none yet). A read error is retried a few times, then
    /// the defaults apply as they did before this store existed.
    pub async fn load(&self) -> BTreeMap<String, String> {
        for attempt in 1..=5u32 {
            match self.api.get_opt(&self.name).await {
                Ok(cm) => {
                    let texts = cm.and_then(|c| c.data).unwrap_or_default();
                    if let Ok(mut stored) = self.stored.lock() {
                        *stored = Some(texts.clone());
                    }
                    return texts;
                }
                Err(error) => {
                    tracing::warn!(%error, attempt, configmap = %self.name, "could not read the last good SLO config");
                    tokio::time::sleep(Duration::from_millis(200) * attempt).await;
                }
            }
        }
        BTreeMap::new()
    }

    /// Stores the texts in force after reading `data` with `problems`, when they changed. A failed
    /// write is logged and tried again on the next config change.
    pub async fn save(&self, data: Option<&BTreeMap<String, String>>, problems: &[ConfigProblem]) {
        let previous = self.stored.lock().ok().and_then(|s| s.clone());
        let next = texts_in_force(
            data,
            problems,
            previous.as_ref().unwrap_or(&BTreeMap::new()),
        );
        if previous.as_ref() == Some(&next) {
            return;
        }
        match self.write(previous.as_ref(), &next).await {
            Ok(()) => {
                if let Ok(mut stored) = self.stored.lock() {
                    *stored = Some(next);
                }
            }
            Err(error) => {
                tracing::warn!(%error, configmap = %self.name, "could not store the last good SLO config");
            }
        }
    }

    async fn write(
        &self,
        previous: Option<&BTreeMap<String, String>>,
        next: &BTreeMap<String, String>,
    ) -> Result<(), kube::Error> {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(
                    [(
                        "app.kubernetes.io/managed-by".to_owned(),
                        self.manager.clone(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            data: Some(next.clone()),
            ..ConfigMap::default()
        };
        match self.api.create(&PostParams::default(), &cm).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(error),
        }
        // It exists: a merge patch that sets every key and removes the ones no longer in force.
        let mut data: serde_json::Map<String, Value> = next
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        for key in previous.into_iter().flat_map(BTreeMap::keys) {
            data.entry(key.clone()).or_insert(Value::Null);
        }
        if previous.is_none() {
            // Unknown content: remove every key this controller reads but does not set.
            for key in nodeslo_core::ConfigKey::ALL {
                data.entry(key.data_key().to_owned()).or_insert(Value::Null);
            }
        }
        self.api
            .patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"data": data})),
            )
            .await
            .map(drop)
    }
}
