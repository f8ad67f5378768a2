//! Logs (tracing, text or JSON) and, when an OTLP endpoint is configured, traces exported over
//! OTLP/gRPC through the tracing-opentelemetry bridge.

use std::io::IsTerminal;

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::RuntimeError;
use crate::cli::{CommonArgs, LogFormat};

/// Keeps the trace pipeline alive; dropping it flushes and shuts the exporter down.
#[derive(Debug, Default)]
#[must_use = "dropping the guard shuts trace export down"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Whether spans are exported (an OTLP endpoint was configured).
    pub fn exports_traces(&self) -> bool {
        self.provider.is_some()
    }

    /// Flushes and shuts the exporter down off the async worker threads.
    pub async fn shutdown(mut self) {
        if let Some(provider) = self.provider.take() {
            let joined = tokio::task::spawn_blocking(move || provider.shutdown()).await;
            if let Ok(Err(error)) = joined {
                eprintln!("telemetry shutdown failed: {error}");
            }
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(error) = provider.shutdown()
        {
            // The subscriber may be gone already; stderr is all that is left.
            eprintln!("telemetry shutdown failed: {error}");
        }
    }
}

/// Parses `--log-level` into an `EnvFilter`.
pub fn env_filter(directive: &str) -> Result<EnvFilter, RuntimeError> {
    EnvFilter::builder()
        .parse(directive)
        .map_err(|source| RuntimeError::LogFilter {
            directive: directive.to_owned(),
            source,
        })
}

/// Installs the global tracing subscriber for `service_name`. Call once, inside the Tokio runtime
/// (the OTLP/gRPC exporter needs it).
pub fn init(service_name: &str, args: &CommonArgs) -> Result<TelemetryGuard, RuntimeError> {
    let filter = env_filter(&args.log_level)?;
    let ansi = std::io::stdout().is_terminal();
    let fmt_layer: Box<dyn Layer<Registry> + Send + Sync> = match args.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer().with_ansi(ansi).boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .boxed(),
    };
    let provider = match args.otlp_endpoint.as_deref().filter(|e| !e.is_empty()) {
        Some(endpoint) => Some(otlp_provider(service_name, endpoint)?),
        None => None,
    };
    let otel_layer = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer().with_tracer(provider.tracer(service_name.to_owned()))
    });
    tracing_subscriber::registry()
        .with(fmt_layer)
        .with(otel_layer)
        .with(filter)
        .try_init()?;
    Ok(TelemetryGuard { provider })
}

fn otlp_provider(service_name: &str, endpoint: &str) -> Result<SdkTracerProvider, RuntimeError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name(service_name.to_owned())
                .build(),
        )
        .build())
}

/// The OpenTelemetry trace id (32 hex digits) of the current span, if spans are being traced.
/// Record it on a reconcile span (`trace_id = tracing::field::Empty`) to link logs and traces.
pub fn trace_id() -> Option<String> {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let context = tracing::Span::current().context();
    let span = context.span();
    let span_context = span.span_context();
    span_context
        .is_valid()
        .then(|| span_context.trace_id().to_string())
}

/// Records the current trace id into the current span's `trace_id` field (declare it as
/// `trace_id = tracing::field::Empty` on the reconcile span). Does nothing when not tracing.
pub fn record_trace_id() {
    if let Some(id) = trace_id() {
        tracing::Span::current().record("trace_id", tracing::field::display(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_level_directives_are_validated() {
        assert!(env_filter("info").is_ok());
        assert!(env_filter("info,kube=debug,capstan_runtime=trace").is_ok());
        let error = env_filter("info,kube=loud").expect_err("bad level is rejected");
        assert!(matches!(error, RuntimeError::LogFilter { .. }));
    }

    #[test]
    fn trace_id_comes_from_the_current_otel_span() {
        // A provider without exporter still assigns real trace ids.
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            assert_eq!(trace_id(), None, "no span, no trace id");
            let outer = tracing::info_span!("reconcile");
            let entered = outer.enter();
            let id = trace_id().expect("span is traced");
            assert_eq!(id.len(), 32);
            assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
            assert_ne!(id, "0".repeat(32));
            let child_id = tracing::info_span!("child").in_scope(trace_id);
            assert_eq!(child_id.as_deref(), Some(id.as_str()), "same trace");
            drop(entered);
            let other = tracing::info_span!("another").in_scope(trace_id);
            assert_ne!(
                other.as_deref(),
                Some(id.as_str()),
                "a new root, a new trace"
            );
        });
    }

    #[test]
    fn record_trace_id_fills_the_span_field() {
        use std::sync::{Arc, Mutex};
        use tracing_subscriber::field::Visit;

        /// Captures values recorded after span creation.
        #[derive(Clone, Default)]
        struct Recorded(Arc<Mutex<Vec<(String, String)>>>);
        impl<S: tracing::Subscriber> Layer<S> for Recorded {
            fn on_record(
                &self,
                _id: &tracing::span::Id,
                values: &tracing::span::Record<'_>,
                _ctx: tracing_subscriber::layer::Context<'_, S>,
            ) {
                struct Fields<'a>(&'a Mutex<Vec<(String, String)>>);
                impl Visit for Fields<'_> {
                    fn record_debug(
                        &mut self,
                        field: &tracing::field::Field,
                        value: &dyn std::fmt::Debug,
                    ) {
                        self.0
                            .lock()
                            .expect("not poisoned")
                            .push((field.name().to_owned(), format!("{value:?}")));
                    }
                }
                values.record(&mut Fields(&self.0));
            }
        }

        let recorded = Recorded::default();
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
            .with(recorded.clone());
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("reconcile", trace_id = tracing::field::Empty);
            let id = span.in_scope(|| {
                record_trace_id();
                trace_id().expect("traced")
            });
            let fields = recorded.0.lock().expect("not poisoned").clone();
            assert!(fields.contains(&("trace_id".to_owned(), id)), "{fields:?}");
        });
    }

    #[test]
    fn trace_id_is_none_without_opentelemetry() {
        let subscriber = tracing_subscriber::registry();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("reconcile");
            assert_eq!(span.in_scope(trace_id), None);
        });
    }
}
