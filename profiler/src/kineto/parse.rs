//! A streaming reader of PyTorch profiler (Kineto) Chrome-trace JSON, plain
//! or gzip: `traceEvents` is visited one event at a time and never held
//! whole; timestamps are read from their decimal text into integer ns.

use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum KinetoError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a Kineto trace: {reason}")]
    Format { path: String, reason: String },
}

/// One trace event, with only the fields gapscope reads.
#[derive(Debug, Default, Deserialize)]
pub struct RawEvent {
    #[serde(default)]
    pub ph: String,
    #[serde(default)]
    pub cat: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub pid: Option<Value>,
    #[serde(default)]
    pub tid: Option<Value>,
    #[serde(default)]
    pub ts: Option<Box<RawValue>>,
    #[serde(default)]
    pub dur: Option<Box<RawValue>>,
    #[serde(default)]
    pub args: Option<Args>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Args {
    pub correlation: Option<u64>,
    pub device: Option<u32>,
    pub stream: Option<u32>,
    pub context: Option<u32>,
    pub bytes: Option<u64>,
    pub cbid: Option<u32>,
    pub name: Option<String>,
    #[serde(rename = "grid")]
    pub grid: Option<Vec<i64>>,
    #[serde(rename = "block")]
    pub block: Option<Vec<i64>>,
}

impl RawEvent {
    pub fn ts_ns(&self) -> Option<u64> {
        self.ts.as_ref().and_then(|r| us_text_to_ns(r.get()))
    }

    pub fn dur_ns(&self) -> Option<u64> {
        self.dur.as_ref().and_then(|r| us_text_to_ns(r.get()))
    }

    pub fn pid_num(&self) -> Option<u64> {
        id_num(self.pid.as_ref())
    }

    pub fn tid_num(&self) -> Option<u64> {
        id_num(self.tid.as_ref())
    }
}

fn id_num(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::Number(n) => n.as_u64().or_else(|| n.as_i64().map(|i| i as u64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A JSON number of microseconds, as written ("1712195495505543.234",
/// "12", "1.5e3"), to integer nanoseconds without going through f64.
/// Digits below a nanosecond are dropped.
pub fn us_text_to_ns(text: &str) -> Option<u64> {
    let t = text.trim().trim_matches('"');
    if t.starts_with('-') {
        return None;
    }
    let (mantissa, exp) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], t[i + 1..].parse::<i32>().ok()?),
        None => (t, 0),
    };
    let (int, frac) = match mantissa.find('.') {
        Some(i) => (&mantissa[..i], &mantissa[i + 1..]),
        None => (mantissa, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Digits of the value in µs, and where the decimal point goes once
    // scaled to ns (3 more places).
    let digits: String = format!("{int}{frac}");
    let point = int.len() as i32 + exp + 3;
    let mut ns: u64 = 0;
    for (i, d) in digits.bytes().enumerate() {
        if i as i32 >= point {
            break;
        }
        ns = ns.checked_mul(10)?.checked_add((d - b'0') as u64)?;
    }
    for _ in digits.len() as i32..point {
        ns = ns.checked_mul(10)?;
    }
    Some(ns)
}

/// What the top level of a trace holds besides its events.
#[derive(Debug, Default)]
pub struct TraceMeta {
    pub device_properties: Vec<Value>,
    pub distributed_info: Option<Value>,
}

struct EventsSeed<'f, F: FnMut(RawEvent)>(&'f mut F);

impl<'de, F: FnMut(RawEvent)> DeserializeSeed<'de> for EventsSeed<'_, F> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, F: FnMut(RawEvent)> Visitor<'de> for EventsSeed<'_, F> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of trace events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(e) = seq.next_element::<RawEvent>()? {
            (self.0)(e);
        }
        Ok(())
    }
}

struct Top<'f, F: FnMut(RawEvent)> {
    on_event: &'f mut F,
    meta: &'f mut TraceMeta,
    saw_events: &'f mut bool,
}

impl<'de, F: FnMut(RawEvent)> Visitor<'de> for Top<'_, F> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object with traceEvents")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "traceEvents" => {
                    map.next_value_seed(EventsSeed(self.on_event))?;
                    *self.saw_events = true;
                }
                "deviceProperties" => self.meta.device_properties = map.next_value()?,
                "distributedInfo" => self.meta.distributed_info = Some(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// Opens a trace file, transparently gunzipping it.
pub fn open(path: &Path) -> Result<Box<dyn BufRead>, KinetoError> {
    let io = |source| KinetoError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut f = BufReader::with_capacity(1 << 20, std::fs::File::open(path).map_err(io)?);
    let gz = f.fill_buf().map_err(io)?.starts_with(&[0x1f, 0x8b]);
    Ok(if gz {
        Box::new(BufReader::with_capacity(
            1 << 20,
            flate2::bufread::MultiGzDecoder::new(f),
        ))
    } else {
        Box::new(f)
    })
}

/// Whether a file looks like a Kineto / Chrome trace (gzip, or JSON text).
pub fn looks_like_trace(path: &Path) -> bool {
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    let mut head = [0u8; 64];
    let n = f.read(&mut head).unwrap_or(0);
    let head = &head[..n];
    head.starts_with(&[0x1f, 0x8b])
        || head
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|&b| b == b'{' || b == b'[')
}

/// Streams every event of the trace at `path` to `on_event`.
pub fn read_events(
    path: &Path,
    mut on_event: impl FnMut(RawEvent),
) -> Result<TraceMeta, KinetoError> {
    let reader = open(path)?;
    let mut meta = TraceMeta::default();
    let mut saw_events = false;
    let mut de = serde_json::Deserializer::from_reader(reader);
    let top = Top {
        on_event: &mut on_event,
        meta: &mut meta,
        saw_events: &mut saw_events,
    };
    de.deserialize_map(top).map_err(|e| KinetoError::Format {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    if !saw_events {
        return Err(KinetoError::Format {
            path: path.display().to_string(),
            reason: "no traceEvents array".into(),
        });
    }
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn microsecond_text_to_exact_nanoseconds() {
        assert_eq!(
            us_text_to_ns("1712195495505543.234"),
            Some(1_712_195_495_505_543_234)
        );
        assert_eq!(
            us_text_to_ns("1712195495505543.2"),
            Some(1_712_195_495_505_543_200)
        );
        assert_eq!(
            us_text_to_ns("1661203462599325"),
            Some(1_661_203_462_599_325_000)
        );
        assert_eq!(us_text_to_ns("41.768"), Some(41_768));
        assert_eq!(us_text_to_ns("0.0005"), Some(0)); // below a ns
        assert_eq!(us_text_to_ns("1.5e3"), Some(1_500_000));
        assert_eq!(us_text_to_ns("2E-3"), Some(2));
        assert_eq!(us_text_to_ns("12."), Some(12_000));
        assert_eq!(us_text_to_ns("-3"), None);
        assert_eq!(us_text_to_ns("abc"), None);
        assert_eq!(us_text_to_ns("."), None);
        assert_eq!(us_text_to_ns("99999999999999999999999"), None);
    }

    #[test]
    fn streams_events_and_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.json");
        std::fs::write(
            &p,
            r#"{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "X"}],
                "traceEvents": [
                  {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.5, "dur": 2,
                   "args": {"device": 0, "stream": 7, "correlation": 5, "grid": [1,2,3]}},
                  {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": "1", "tid": 2, "ts": 1, "dur": 3}
                ],
                "distributedInfo": {"rank": 3}}"#,
        )
        .unwrap();
        let mut events = Vec::new();
        let meta = read_events(&p, |e| events.push(e)).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].ts_ns(), Some(10_500));
        assert_eq!(events[0].args.as_ref().unwrap().correlation, Some(5));
        assert_eq!(events[1].pid_num(), Some(1));
        assert_eq!(meta.device_properties.len(), 1);
        assert_eq!(meta.distributed_info.unwrap()["rank"], 3);
        assert!(looks_like_trace(&p));
    }

    #[test]
    fn bad_traces_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.json");
        for text in [
            "",
            "{",
            "[]",
            "{\"traceEvents\": 5}",
            "{\"other\": []}",
            "{\"traceEvents\": [{\"ts\": 1]}",
        ] {
            std::fs::write(&p, text).unwrap();
            assert!(read_events(&p, |_| {}).is_err(), "{text:?}");
        }
    }
}
