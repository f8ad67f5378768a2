//! [`metric_families!`](crate::metric_families): a controller's metrics named, described and
//! registered in one place.
//!
//! Every controller keeps a struct of `prometheus_client` families and a `register` that hands
//! each to the registry with its name and help text. Written by hand, the two lists drift apart
//! (a field never registered exports nothing) and every controller repeats the same lines; the
//! macro derives both from one declaration, the field's doc comment being the metric's help.

/// Declares a struct of metric families and its `register(&mut Registry) -> Self`.
///
/// Each field reads `name: Type = "metric_name"`, optionally followed by `in Unit` (a
/// [`prometheus_client::registry::Unit`] variant, appended to the name as OpenMetrics does) and
/// `=> constructor` for families that have no `Default` (histograms with their buckets). The
/// field's doc comment is the help text. Methods that update the families go in an ordinary
/// `impl` beside it.
///
/// ```
/// use prometheus_client::metrics::counter::Counter;
/// use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
///
/// capstan_runtime::metric_families! {
///     /// What the example exports.
///     #[derive(Clone, Debug)]
///     pub struct ExampleMetrics {
///         /// Jobs done
///         jobs: Counter = "example_jobs",
///         /// Time one job took
///         job_duration: Histogram = "example_job_duration" in Seconds
///             => Histogram::new(exponential_buckets(0.01, 2.0, 10)),
///     }
/// }
///
/// let mut registry = prometheus_client::registry::Registry::default();
/// let metrics = ExampleMetrics::register(&mut registry);
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
/// assert!(text.contains("# HELP example_jobs Jobs done."));
/// assert!(text.contains("# TYPE example_job_duration_seconds histogram"));
/// # let _ = metrics;
/// ```
#[macro_export]
macro_rules! metric_families {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[doc = $help:literal])+
                $field:ident: $ty:ty = $metric:literal $(in $unit:ident)? $(=> $init:expr)?
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(#[doc = $help])+ $field: $ty, )+
        }

        impl $name {
            /// Creates every family and registers it under its metric name.
            pub fn register(registry: &mut $crate::prometheus_client::registry::Registry) -> Self {
                let metrics = Self {
                    $( $field: $crate::metric_families!(@init $($init)?), )+
                };
                $(
                    $crate::metric_families!(
                        @register registry, $metric,
                        concat!($($help),+).trim(), metrics.$field $(, $unit)?
                    );
                )+
                metrics
            }
        }
    };
    (@init) => { ::core::default::Default::default() };
    (@init $init:expr) => { $init };
    (@register $registry:ident, $metric:literal, $help:expr, $family:expr) => {
        $registry.register($metric, $help, $family.clone())
    };
    (@register $registry:ident, $metric:literal, $help:expr, $family:expr, $unit:ident) => {
        $registry.register_with_unit(
            $metric,
            $help,
            $crate::prometheus_client::registry::Unit::$unit,
            $family.clone(),
        )
    };
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::registry::Registry;

    type Labels = Vec<(String, String)>;

    crate::metric_families! {
        #[derive(Clone)]
        struct Sample {
            /// Things counted,
            /// by kind
            counted: Family<Labels, Counter> = "sample_counted",
            /// Things held
            held: Gauge = "sample_held",
            /// Time taken
            took: Histogram = "sample_took" in Seconds => Histogram::new([0.1, 1.0].into_iter()),
        }
    }

    #[test]
    fn every_field_is_registered_under_its_name_with_its_doc_as_help_and_its_unit() {
        let mut registry = Registry::default();
        let sample = Sample::register(&mut registry);
        sample
            .counted
            .get_or_create(&vec![("kind".into(), "a".into())])
            .inc();
        sample.held.set(3);
        sample.took.observe(0.5);
        let mut text = String::new();
        encode(&mut text, &registry).expect("encodes");
        for line in [
            "# HELP sample_counted Things counted, by kind.",
            "sample_counted_total{kind=\"a\"} 1",
            "# HELP sample_held Things held.",
            "sample_held 3",
            "# TYPE sample_took_seconds histogram",
            "sample_took_seconds_bucket{le=\"1.0\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing in\n{text}"
            );
        }
    }
}
