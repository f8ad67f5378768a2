//! Kubernetes Events (`events.k8s.io/v1`) with series aggregation that never hides a new message.
//!
//! kube-runtime's `Recorder` counts a repeated Event into one series keyed by type, reason and
//! action, but not by note: a later, different error is counted into the first one and its
//! message is lost. Here the note is part of the key, so a different message is a new Event (the
//! note of an `events.k8s.io/v1` Event is immutable), and the newest Event for an object always
//! says what went wrong last.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};

use crate::sync::lock;

/// Whether an Event reports normal progress or something an operator should look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// One Event to publish about an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub type_: EventType,
    /// Why, in `UpperCamelCase` (`ValidationFailed`).
    pub reason: String,
    /// What the controller was doing, in `UpperCamelCase` (`Create`).
    pub action: String,
    /// The human-readable message (at most 1 KiB is kept).
    pub note: String,
}

impl Event {
    pub fn new(
        type_: EventType,
        reason: impl Into<String>,
        action: impl Into<String>,
        note: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            reason: reason.into(),
            action: action.into(),
            note: note.into(),
        }
    }

    pub fn warning(
        reason: impl Into<String>,
        action: impl Into<String>,
        note: impl Into<String>,
    ) -> Self {
        Self::new(EventType::Warning, reason, action, note)
    }

    pub fn normal(
        reason: impl Into<String>,
        action: impl Into<String>,
        note: impl Into<String>,
    ) -> Self {
        Self::new(EventType::Normal, reason, action, note)
    }
}

/// How long a published Event is counted into (kube-runtime's value: 6 minutes).
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);
/// The API server's limit for `note`.
const NOTE_LIMIT: usize = 1024;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SeriesKey {
    type_: EventType,
    reason: String,
    action: String,
    note: String,
    regarding: (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ),
}

/// Publishes Events for one controller (`reportingController`), aggregating exact repeats.
pub struct EventPublisher {
    client: Client,
    controller: String,
    instance: String,
    series: Mutex<HashMap<SeriesKey, K8sEvent>>,
}

impl std::fmt::Debug for EventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventPublisher")
            .field("controller", &self.controller)
            .finish_non_exhaustive()
    }
}

impl EventPublisher {
    /// `controller` is the `reportingController`; the instance is `POD_NAME` when set.
    pub fn new(client: Client, controller: &str) -> Self {
        let instance = std::env::var("POD_NAME")
            .ok()
            .filter(|pod| !pod.is_empty())
            .unwrap_or_else(|| controller.to_owned());
        Self {
            client,
            controller: controller.to_owned(),
            instance,
            series: Mutex::default(),
        }
    }

    /// Publishes `event` about `regarding`. The same event again within the series window bumps
    /// the series count of the existing Event; any other note makes a new Event.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let note = truncate(&event.note, NOTE_LIMIT);
        let key = SeriesKey {
            type_: event.type_,
            reason: event.reason.clone(),
            action: event.action.clone(),
            note: note.clone(),
            regarding: (
                regarding.api_version.clone(),
                regarding.kind.clone(),
                regarding.namespace.clone(),
                regarding.name.clone(),
            ),
        };
        let ttl = jiff_span(SERIES_TTL);
        let existing = {
            let mut series = lock(&self.series);
            series.retain(|_, published| last_seen(published).is_some_and(|t| t + ttl > now));
            series.get(&key).cloned()
        };
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        let published = match existing {
            Some(mut repeated) => {
                let count = repeated.series.as_ref().map_or(2, |s| s.count + 1);
                repeated.series = Some(EventSeries {
                    count,
                    last_observed_time: MicroTime(now),
                });
                let patch = serde_json::json!({"series": repeated.series});
                api.patch(
                    &repeated.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
                repeated
            }
            None => {
                let fresh = self.new_event(event, note, regarding, now);
                api.create(&PostParams::default(), &fresh).await?;
                fresh
            }
        };
        lock(&self.series).insert(key, published);
        Ok(())
    }

    /// Publishes and logs a failure at warn level: an Event is never worth failing a reconcile.
    pub async fn publish_or_log(&self, event: &Event, regarding: &ObjectReference) {
        if let Err(error) = self.publish(event, regarding).await {
            tracing::warn!(%error, reason = %event.reason, "could not publish Event");
        }
    }

    fn new_event(
        &self,
        event: &Event,
        note: String,
        regarding: &ObjectReference,
        now: Timestamp,
    ) -> K8sEvent {
        let object = regarding.name.as_deref().unwrap_or(&self.controller);
        K8sEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            note: Some(note),
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(format!("{object}.{:x}", now.as_nanosecond())),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(event.type_.as_str().to_owned()),
            ..K8sEvent::default()
        }
    }
}

fn last_seen(event: &K8sEvent) -> Option<Timestamp> {
    event
        .series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
}

fn jiff_span(duration: Duration) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::try_from(duration)
        .unwrap_or(k8s_openapi::jiff::SignedDuration::MAX)
}

/// `text` cut to at most `max` bytes on a character boundary.
pub fn truncate(text: &str, max: usize) -> String {
    let mut cut = max.min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text[..cut].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate("abc", 10), "abc");
        assert_eq!(truncate("abcdef", 3), "abc");
        assert_eq!(truncate("aé", 2), "a", "é is two bytes");
    }
}
