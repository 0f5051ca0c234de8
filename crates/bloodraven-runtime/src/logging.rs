//! Structured logs: one JSON object per line with `ts` (RFC 3339), `level`, `target`, `msg`
//! and the event's fields at the top level, e.g.
//!
//! ```text
//! {"ts":"2026-11-30T10:00:30.123Z","level":"INFO","target":"bloodraven_operator::api","msg":"deploy api","handler":"renew","group":"playground","status":200}
//! ```
//!
//! Contract messages (`deploy api`, `SELF-FENCING: …`, `safety net: …`) are matched on `msg`.
//! [`capture`] installs the same format into a buffer, so tests can assert on exact lines and on
//! the absence of secrets.

use std::fmt;
use std::io::{self, Write};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use bloodraven_core::time::Clock;
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

use crate::clock::SystemClock;

/// Formats events as one JSON object per line.
#[derive(Debug, Default, Clone, Copy)]
pub struct JsonLines;

struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.insert(field, Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.insert(field, Value::String(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.insert(field, Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.insert(field, Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.insert(field, Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.insert(field, Value::from(value));
    }
}

impl Fields {
    fn insert(&mut self, field: &Field, value: Value) {
        let name = match field.name() {
            "message" => "msg",
            n => n,
        };
        self.0.insert(name.to_string(), value);
    }
}

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut fields = Fields(Map::new());
        event.record(&mut fields);
        let mut line = Map::new();
        line.insert("ts".into(), Value::String(SystemClock.now().to_rfc3339()));
        line.insert("level".into(), Value::String(meta.level().to_string()));
        line.insert("target".into(), Value::String(meta.target().to_string()));
        if let Some(msg) = fields.0.remove("msg") {
            line.insert("msg".into(), msg);
        }
        line.extend(fields.0);
        let text = serde_json::to_string(&Value::Object(line)).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// Log format of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line (the default for services).
    Json,
    /// tracing's human-readable lines.
    Text,
}

/// The default level filter: `info`, but third-party libraries only at `error`. rustls, for
/// one, warns about every client that sends an IP address as its TLS server name (curl does),
/// which is noise to an operator; `BLOODRAVEN_LOG=debug` shows it again.
pub const DEFAULT_FILTER: &str = "info,rustls=error,hyper=error,hyper_util=error,h2=error,reqwest=error,mysql_async=error,kube=error,tower=error";

fn filter() -> EnvFilter {
    EnvFilter::try_from_env("BLOODRAVEN_LOG").unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER))
}

/// Installs the process's log subscriber (stderr). The level filter comes from
/// `BLOODRAVEN_LOG` (e.g. `debug`, `bloodraven_operator=debug`), default [`DEFAULT_FILTER`]. Returns
/// `false` when a subscriber was already installed.
pub fn init(format: Format) -> bool {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(io::stderr);
    match format {
        Format::Json => builder.event_format(JsonLines).try_init().is_ok(),
        Format::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&io::stderr()))
            .try_init()
            .is_ok(),
    }
}

/// The lines logged since [`capture`] was first called in this process.
#[derive(Clone, Debug, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// Every captured line.
    pub fn lines(&self) -> Vec<String> {
        let buf = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&buf)
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Every captured line, parsed.
    pub fn records(&self) -> Vec<Map<String, Value>> {
        self.lines()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| match v {
                Value::Object(m) => Some(m),
                _ => None,
            })
            .collect()
    }

    /// The whole captured text.
    pub fn text(&self) -> String {
        let buf = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&buf).into_owned()
    }
}

/// Writes into a [`Captured`] buffer.
#[derive(Debug)]
pub struct CaptureWriter(Arc<Mutex<Vec<u8>>>);

impl Write for CaptureWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = CaptureWriter;
    fn make_writer(&'a self) -> Self::Writer {
        CaptureWriter(self.0.clone())
    }
}

/// Installs (once per process) a global subscriber that writes JSON lines, at `debug` level,
/// into a buffer, and returns it. For tests: under cargo-nextest each test is its own process;
/// under `cargo test` tests share the buffer, so assert on lines that name your own objects.
pub fn capture() -> Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED
        .get_or_init(|| {
            let c = Captured::default();
            let _ = tracing_subscriber::fmt()
                .with_env_filter(EnvFilter::new("debug"))
                .with_writer(c.clone())
                .event_format(JsonLines)
                .try_init();
            c
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_json_with_msg_and_top_level_fields() {
        let c = capture();
        tracing::info!(handler = "renew", status = 200u64, "deploy api");
        let rec = c
            .records()
            .into_iter()
            .find(|r| r.get("msg") == Some(&Value::String("deploy api".into())))
            .expect("captured line");
        assert_eq!(rec.get("handler"), Some(&Value::String("renew".into())));
        assert_eq!(rec.get("status"), Some(&Value::from(200u64)));
        assert_eq!(rec.get("level"), Some(&Value::String("INFO".into())));
        assert!(
            rec.get("ts")
                .and_then(Value::as_str)
                .is_some_and(|t| t.ends_with('Z'))
        );
    }

    #[test]
    fn the_default_filter_keeps_library_warnings_out_and_ours_in() {
        let c = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new(DEFAULT_FILTER))
            .with_writer(c.clone())
            .event_format(JsonLines)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(target: "rustls::server::hs", "Illegal SNI extension: ignoring IP address presented as hostname");
            tracing::info!(target: "hyper_util::client", "connection noise");
            tracing::info!(target: "bloodraven_operator::api", "deploy api");
            tracing::error!(target: "rustls::conn", "a real TLS failure");
        });
        let text = c.text();
        assert!(!text.contains("Illegal SNI"), "{text}");
        assert!(!text.contains("connection noise"), "{text}");
        assert!(text.contains("deploy api"), "{text}");
        assert!(text.contains("a real TLS failure"), "{text}");
    }
}
