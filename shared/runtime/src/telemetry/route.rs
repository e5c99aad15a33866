//! One `service.name` per service when several run in one process (`switchboard up`).
//!
//! OpenTelemetry names the service on the *resource*, one per tracer provider, so a process
//! that hosts six services would export every span as one service. [`ByService`] is the one
//! span processor of such a process: it gives each service its own batch processor (and so its
//! own resource), and sends each span to the processor of the service it belongs to — the one
//! its [`SERVICE_ATTRIBUTE`] names, else its local parent's, else the process's own name.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use opentelemetry::trace::{Span as _, SpanId, TraceContextExt as _};
use opentelemetry::{Context, Key, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};

/// The span attribute naming the service a span belongs to; set on every request handler's
/// span (see `micro`) and on a service's own root spans.
pub const SERVICE_ATTRIBUTE: &str = "switchboard.service";

/// Spans started and not yet ended that this processor tracks; past this (spans that never end,
/// which tracing does not produce) the map is cleared rather than grown.
const TRACKED_MAX: usize = 100_000;

/// Routes spans to one processor per service (see the module docs).
#[derive(Debug)]
pub struct ByService<P> {
    /// Service names, index-aligned with `processors`; the first is the process's own name.
    names: Vec<String>,
    processors: Vec<P>,
    /// The service index of each started span, for its children and its end.
    owners: Mutex<HashMap<SpanId, usize>>,
}

impl<P: SpanProcessor> ByService<P> {
    /// `routes` pairs each service name with its processor; the first is where spans of no
    /// service go (the process's own name, e.g. `switchboard`).
    pub fn new(routes: Vec<(String, P)>) -> Self {
        let (names, processors) = routes.into_iter().unzip();
        Self {
            names,
            processors,
            owners: Mutex::default(),
        }
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|known| known == name)
    }
}

impl<P: SpanProcessor> SpanProcessor for ByService<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        let parent = cx.span();
        let parent = parent.span_context();
        let mut owners = self
            .owners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let inherited = (parent.is_valid() && !parent.is_remote())
            .then(|| owners.get(&parent.span_id()).copied())
            .flatten();
        // Its own attribute wins (a service's span under another's, in process); reading the
        // attributes copies the span's data, so only spans that need it pay for it.
        let own = match inherited {
            Some(_) if self.names.len() == 1 => None,
            _ => span.exported_data().and_then(|data| {
                data.attributes
                    .iter()
                    .find(|kv| kv.key.as_str() == SERVICE_ATTRIBUTE)
                    .and_then(|kv| self.index_of(kv.value.as_str().as_ref()))
            }),
        };
        let index = own.or(inherited).unwrap_or(0);
        if owners.len() >= TRACKED_MAX {
            owners.clear();
        }
        owners.insert(span.span_context().span_id(), index);
        drop(owners);
        if let Some(processor) = self.processors.get(index) {
            processor.on_start(span, cx);
        }
    }

    fn on_end(&self, span: SpanData) {
        let index = self
            .owners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&span.span_context.span_id())
            .unwrap_or(0);
        if let Some(processor) = self.processors.get(index) {
            processor.on_end(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        let mut result = Ok(());
        for processor in &self.processors {
            if let Err(err) = processor.force_flush() {
                result = Err(err);
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let mut result = Ok(());
        for processor in &self.processors {
            if let Err(err) = processor.shutdown_with_timeout(timeout) {
                result = Err(err);
            }
        }
        result
    }

    fn set_resource(&mut self, resource: &Resource) {
        for (name, processor) in self.names.iter().zip(&mut self.processors) {
            processor.set_resource(&with_service_name(resource, name));
        }
    }
}

/// `resource` with `service.name` replaced by `name`.
pub fn with_service_name(resource: &Resource, name: &str) -> Resource {
    let service_name = Key::from_static_str("service.name");
    Resource::builder_empty()
        .with_attributes(
            resource
                .iter()
                .filter(|(key, _)| **key != service_name)
                .map(|(key, value)| KeyValue::new(key.clone(), value.clone())),
        )
        .with_service_name(name.to_owned())
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use opentelemetry::trace::{Tracer, TracerProvider as _};
    use opentelemetry_sdk::trace::{SdkTracerProvider, SimpleSpanProcessor, SpanExporter};

    /// Keeps the names of the spans it exports.
    #[derive(Debug, Clone, Default)]
    struct Names(Arc<Mutex<Vec<String>>>);

    impl SpanExporter for Names {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            let mut names = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            names.extend(batch.into_iter().map(|span| span.name.to_string()));
            Ok(())
        }
    }

    impl Names {
        fn taken(&self) -> Vec<String> {
            self.0.lock().map(|names| names.clone()).unwrap_or_default()
        }
    }

    #[test]
    fn each_span_exports_under_its_service_and_children_follow_their_parent() {
        let exporters: Vec<Names> = (0..3).map(|_| Names::default()).collect();
        let routes = ["switchboard", "directory", "audit"]
            .iter()
            .zip(&exporters)
            .map(|(name, exporter)| {
                (
                    (*name).to_owned(),
                    SimpleSpanProcessor::new(exporter.clone()),
                )
            })
            .collect();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(ByService::new(routes))
            .with_resource(Resource::builder().with_service_name("switchboard").build())
            .build();
        let tracer = provider.tracer("test");
        tracer.in_span("no service", |_| {});
        let root = tracer
            .span_builder("directory.register")
            .with_attributes([KeyValue::new(SERVICE_ATTRIBUTE, "directory")])
            .start(&tracer);
        let cx = Context::current_with_span(root);
        {
            let _attached = cx.clone().attach();
            tracer.in_span("a child", |_| {});
            // A span naming another service under it goes to that service.
            let audit = tracer
                .span_builder("audit.record")
                .with_attributes([KeyValue::new(SERVICE_ATTRIBUTE, "audit")])
                .start(&tracer);
            drop(audit);
        }
        cx.span().end();
        assert_eq!(exporters[0].taken(), vec!["no service"]);
        assert_eq!(exporters[1].taken(), vec!["a child", "directory.register"]);
        assert_eq!(exporters[2].taken(), vec!["audit.record"]);
    }

    #[test]
    fn the_resource_keeps_everything_but_the_name() {
        let resource = Resource::builder()
            .with_service_name("switchboard")
            .with_attribute(KeyValue::new("service.namespace", "switchboard"))
            .build();
        let renamed = with_service_name(&resource, "audit");
        let get = |key| {
            renamed
                .get(&Key::from_static_str(key))
                .map(|v| v.to_string())
        };
        assert_eq!(get("service.name"), Some("audit".to_owned()));
        assert_eq!(get("service.namespace"), Some("switchboard".to_owned()));
    }
}
