//! A minimal OTLP/HTTP collector: what the services export when `telemetry.otlp_endpoint` is
//! set, decoded into spans (with their resource's `service.name`) and metric names.

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message as _;

/// Bodies received, by signal.
#[derive(Debug, Clone, Default)]
pub struct OtlpSink {
    /// The URL to export to (`http://127.0.0.1:<port>`).
    pub url: String,
    /// Every POST to /v1/traces.
    pub traces: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Every POST to /v1/metrics.
    pub metrics: Arc<Mutex<Vec<Vec<u8>>>>,
}

/// A span as received, flattened.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// Its resource's `service.name`.
    pub service: String,
    /// Its name.
    pub name: String,
    /// Hex trace id.
    pub trace_id: String,
    /// Hex span id.
    pub span_id: String,
    /// Hex parent span id; empty for a root.
    pub parent: String,
    /// OTLP span kind (2 server, 3 client, 4 producer, 5 consumer).
    pub kind: i32,
    /// OTLP status code (2 = error).
    pub status: i32,
    /// String attributes.
    pub attributes: Vec<(String, String)>,
}

impl ReceivedSpan {
    /// A string attribute.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| value.as_str())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(kv: &KeyValue) -> Option<String> {
    match kv.value.as_ref()?.value.as_ref()? {
        AnyValue::StringValue(s) => Some(s.clone()),
        AnyValue::IntValue(i) => Some(i.to_string()),
        AnyValue::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A resource's `service.name` (empty when it has none).
fn service_name(resource: Option<&opentelemetry_proto::tonic::resource::v1::Resource>) -> String {
    resource
        .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
        .and_then(text)
        .unwrap_or_default()
}

impl OtlpSink {
    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        let bodies = self.traces.lock().unwrap().clone();
        let mut spans = Vec::new();
        for body in bodies {
            let Ok(request) = ExportTraceServiceRequest::decode(body.as_slice()) else {
                continue;
            };
            for resource in request.resource_spans {
                let service = service_name(resource.resource.as_ref());
                for scope in resource.scope_spans {
                    for span in scope.spans {
                        spans.push(ReceivedSpan {
                            service: service.clone(),
                            name: span.name.clone(),
                            trace_id: hex(&span.trace_id),
                            span_id: hex(&span.span_id),
                            parent: hex(&span.parent_span_id),
                            kind: span.kind,
                            status: span.status.as_ref().map_or(0, |s| s.code),
                            attributes: span
                                .attributes
                                .iter()
                                .filter_map(|kv| Some((kv.key.clone(), text(kv)?)))
                                .collect(),
                        });
                    }
                }
            }
        }
        spans
    }

    /// The names of every metric received so far, with their resource's `service.name`.
    pub fn metric_names(&self) -> Vec<(String, String)> {
        let bodies = self.metrics.lock().unwrap().clone();
        let mut names = Vec::new();
        for body in bodies {
            let Ok(request) = ExportMetricsServiceRequest::decode(body.as_slice()) else {
                continue;
            };
            for resource in request.resource_metrics {
                let service = service_name(resource.resource.as_ref());
                for scope in resource.scope_metrics {
                    for metric in scope.metrics {
                        names.push((service.clone(), metric.name));
                    }
                }
            }
        }
        names
    }
}

/// Starts an OTLP/HTTP collector on a free port, recording every POST to /v1/traces and
/// /v1/metrics.
pub async fn otlp_collector() -> OtlpSink {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sink = OtlpSink {
        url: format!("http://{}", listener.local_addr().unwrap()),
        ..OtlpSink::default()
    };
    let kept = sink.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    let n = socket.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map(|v| v.trim().parse().unwrap())
                        .unwrap_or(0);
                    if buf.len() < end + 4 + length {
                        continue;
                    }
                    let body = buf[end + 4..end + 4 + length].to_vec();
                    if head.starts_with("post /v1/traces") {
                        kept.traces.lock().unwrap().push(body);
                    } else if head.starts_with("post /v1/metrics") {
                        kept.metrics.lock().unwrap().push(body);
                    }
                    buf.drain(..end + 4 + length);
                    let _ = socket
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .await;
                }
            });
        }
    });
    sink
}

/// Receives OTLP/gRPC trace exports into an [`OtlpSink`] (stored re-encoded, as the HTTP
/// collector stores the bodies it receives).
#[derive(Debug, Clone)]
struct GrpcTraces(OtlpSink);

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService
    for GrpcTraces
{
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<
        tonic::Response<
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse,
        >,
        tonic::Status,
    > {
        self.0
            .traces
            .lock()
            .unwrap()
            .push(request.into_inner().encode_to_vec());
        Ok(tonic::Response::new(Default::default()))
    }
}

/// Starts an OTLP/gRPC collector (traces) on a free port.
pub async fn otlp_grpc_collector() -> OtlpSink {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer;
    let port = switchboard_testkit::free_port();
    let sink = OtlpSink {
        url: format!("http://127.0.0.1:{port}"),
        ..OtlpSink::default()
    };
    let service = TraceServiceServer::new(GrpcTraces(sink.clone()));
    tokio::spawn(async move {
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve(address)
            .await;
    });
    // Serving once it accepts connections.
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    sink
}

/// A minimal OTLP/HTTP sink: records the body of every POST to /v1/traces.
pub async fn otlp_sink() -> (String, Arc<Mutex<Vec<Vec<u8>>>>) {
    let sink = otlp_collector().await;
    (sink.url, sink.traces)
}
