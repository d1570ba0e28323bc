//! A streaming reader of PyTorch profiler (Kineto) Chrome-trace JSON, plain
//! or gzip: `traceEvents` is visited one event at a time and never held
//! whole; timestamps are read from their decimal text into integer ns.
//!
//! A trace is someone else's file, so what it can cost is bounded by its
//! size: gzip input unpacks to at most [`GZ_MAX_RATIO`] times the file (and
//! at least [`GZ_FREE`]), text fields are kept to [`MAX_TEXT`], and only the
//! fields gapscope reads are kept at all.

use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// How many times its own size a gzip trace may unpack to. Real PyTorch
/// traces unpack 13-20 times (the two in tests/data: 13.3 and 19.7; at
/// `gzip -9`, 14.6 and 22.3); a ratio far past that is a file built to
/// cost memory, and its events would be held on the way there.
pub const GZ_MAX_RATIO: u64 = 50;
/// What any gzip trace may unpack to, whatever its ratio: a small trace's
/// ratio says little.
pub const GZ_FREE: u64 = 64 << 20;
/// Longest text field kept (kernel and op names; longer ones are cut): real
/// names, C++ templates included, are a few KiB at most, and every op holds
/// its name for the whole analysis.
pub const MAX_TEXT: usize = 64 << 10;
/// Devices read from `deviceProperties`; a machine has a handful.
const MAX_DEVICES: usize = 1024;
/// Exponents a time can be written with: µs since the epoch are 16 digits,
/// and ns fit 20, so any exponent past this is either zero or an overflow.
/// Refusing it first keeps "0e2147483640" from being scaled a digit at a
/// time.
const MAX_EXP: i64 = 30;

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
    /// Past a cap on what reading it may cost (see the module's doc).
    #[error("{path}: refused: {reason}")]
    TooLarge { path: String, reason: String },
}

/// Why [`Unpacked`] stopped, carried through the JSON parser's I/O error.
#[derive(Debug)]
struct TooLarge(String);

impl fmt::Display for TooLarge {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TooLarge {}

/// One trace event, with only the fields gapscope reads.
#[derive(Debug, Default, Deserialize)]
pub struct RawEvent {
    #[serde(default, deserialize_with = "text")]
    pub ph: String,
    #[serde(default, deserialize_with = "text")]
    pub cat: String,
    #[serde(default, deserialize_with = "text")]
    pub name: String,
    #[serde(default)]
    pub pid: Option<Id>,
    #[serde(default)]
    pub tid: Option<Id>,
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
    #[serde(default, deserialize_with = "some_text")]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "dims")]
    pub grid: Option<Vec<i64>>,
    #[serde(default, deserialize_with = "dims")]
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
        self.pid.and_then(|i| i.0)
    }

    pub fn tid_num(&self) -> Option<u64> {
        self.tid.and_then(|i| i.0)
    }
}

/// A process or thread id: an integer (a negative one as its two's
/// complement) or a string of one; anything else is no id. Read without
/// keeping what it was written as, so a giant string or array costs nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Id(pub Option<u64>);

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Id, D::Error> {
        d.deserialize_any(loose(|v| match v {
            Scalar::U64(n) => Some(n),
            Scalar::I64(n) => Some(n as u64),
            Scalar::Str(s) => s.trim().parse().ok(),
            Scalar::F64 | Scalar::Other => None,
        }))
        .map(Id)
    }
}

/// A JSON value as the loose readers below see it: strings and integers
/// only, borrowed for as long as the visit lasts.
enum Scalar<'a> {
    U64(u64),
    I64(i64),
    Str(&'a str),
    F64,
    Other,
}

/// Reads any JSON value through `f`; arrays and objects are skipped
/// (without building them) and count as [`Scalar::Other`].
struct Loose<F>(F);

/// [`Loose`], with `f` taking a [`Scalar`] of any lifetime.
fn loose<T, F: FnOnce(Scalar) -> Option<T>>(f: F) -> Loose<F> {
    Loose(f)
}

impl<'de, T, F: FnOnce(Scalar) -> Option<T>> Visitor<'de> for Loose<F> {
    type Value = Option<T>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_u64<E>(self, v: u64) -> Result<Option<T>, E> {
        Ok((self.0)(Scalar::U64(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Option<T>, E> {
        Ok((self.0)(Scalar::I64(v)))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Option<T>, E> {
        Ok((self.0)(Scalar::F64))
    }
    fn visit_str<E>(self, v: &str) -> Result<Option<T>, E> {
        Ok((self.0)(Scalar::Str(v)))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Option<T>, E> {
        Ok((self.0)(Scalar::Other))
    }
    fn visit_unit<E>(self) -> Result<Option<T>, E> {
        Ok((self.0)(Scalar::Other))
    }
    fn visit_none<E>(self) -> Result<Option<T>, E> {
        Ok((self.0)(Scalar::Other))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<T>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok((self.0)(Scalar::Other))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<T>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok((self.0)(Scalar::Other))
    }
}

/// `s` cut to at most [`MAX_TEXT`] bytes, on a character boundary.
fn capped(s: &str) -> String {
    let mut end = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// A string field, cut to [`MAX_TEXT`]: only the kept part is copied out
/// of the parser's buffer.
struct Text;

impl Visitor<'_> for Text {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E>(self, v: &str) -> Result<String, E> {
        Ok(capped(v))
    }
}

fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    d.deserialize_str(Text)
}

fn some_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Option::<Capped>::deserialize(d).map(|c| c.map(|c| c.0))
}

/// [`Text`] as a type, for `Option`.
struct Capped(String);

impl<'de> Deserialize<'de> for Capped {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Capped, D::Error> {
        d.deserialize_str(Text).map(Capped)
    }
}

/// A grid or block: its first three numbers, the rest skipped unread.
fn dims<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<i64>>, D::Error> {
    struct Dims;
    impl<'de> Visitor<'de> for Dims {
        type Value = Option<Vec<i64>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an array of integers")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(self)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut v = Vec::with_capacity(3);
            while v.len() < 3 {
                match seq.next_element::<i64>()? {
                    Some(n) => v.push(n),
                    None => return Ok(Some(v)),
                }
            }
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Some(v))
        }
    }
    d.deserialize_option(Dims)
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
        Some(i) => (&t[..i], t[i + 1..].parse::<i64>().ok()?),
        None => (t, 0),
    };
    if !(-MAX_EXP..=MAX_EXP).contains(&exp) {
        return None;
    }
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
    // scaled to ns (3 more places). Both loops end within the text's length
    // plus MAX_EXP + 3 digits.
    let digits = int.len() + frac.len();
    let point = i64::try_from(int.len()).ok()? + exp + 3;
    let mut ns: u64 = 0;
    for (i, d) in int.bytes().chain(frac.bytes()).enumerate() {
        if i64::try_from(i).ok()? >= point {
            break;
        }
        ns = ns.checked_mul(10)?.checked_add((d - b'0') as u64)?;
    }
    for _ in i64::try_from(digits).ok()?..point {
        ns = ns.checked_mul(10)?;
    }
    Some(ns)
}

/// What the top level of a trace holds besides its events.
#[derive(Debug, Default)]
pub struct TraceMeta {
    /// Id and name of each device in `deviceProperties` that gives both.
    pub devices: Vec<(u64, String)>,
    /// `distributedInfo`'s rank and world size.
    pub rank: Option<u64>,
    pub world_size: Option<u64>,
}

/// An object's key, kept only when it is short enough to be one gapscope
/// reads: a giant key is skipped like any other.
struct Key(Option<String>);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        d.deserialize_any(loose(|v| match v {
            Scalar::Str(s) if s.len() <= 32 => Some(s.to_string()),
            _ => None,
        }))
        .map(Key)
    }
}

/// `deviceProperties`: each entry's id and name, for at most
/// [`MAX_DEVICES`] of them; entries without both are passed over.
struct Devices<'m>(&'m mut Vec<(u64, String)>);

impl<'de> DeserializeSeed<'de> for Devices<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Devices<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of device properties")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.clear();
        while let Some(fields) = seq.next_element::<Fields>()? {
            if let (Some(id), Some(name), true) = (
                fields.num("id"),
                fields.str("name"),
                self.0.len() < MAX_DEVICES,
            ) {
                self.0.push((id, name.to_string()));
            }
        }
        Ok(())
    }
}

/// The integer and string fields of an object, of the keys gapscope
/// reads ([`META_KEYS`]), the last of a repeated key winning; any other
/// value reads as an empty object.
#[derive(Default)]
struct Fields(Vec<(String, Option<u64>, Option<String>)>);

impl Fields {
    fn get(&self, key: &str) -> Option<&(String, Option<u64>, Option<String>)> {
        self.0.iter().find(|(k, ..)| k == key)
    }
    fn num(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(|f| f.1)
    }
    fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(|f| f.2.as_deref())
    }
}

/// Keys of [`Fields`] worth keeping; the rest are skipped unread.
const META_KEYS: [&str; 4] = ["id", "name", "rank", "world_size"];

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Fields, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Fields;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
                let mut out = Fields::default();
                while let Some(Key(key)) = map.next_key()? {
                    match key {
                        Some(k) if META_KEYS.contains(&k.as_str()) => {
                            let Field(n, s) = map.next_value()?;
                            out.0.retain(|f| f.0 != k);
                            out.0.push((k, n, s));
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(out)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Fields, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Fields::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<Fields, E> {
                Ok(Fields::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<Fields, E> {
                Ok(Fields::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<Fields, E> {
                Ok(Fields::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<Fields, E> {
                Ok(Fields::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<Fields, E> {
                Ok(Fields::default())
            }
            fn visit_unit<E>(self) -> Result<Fields, E> {
                Ok(Fields::default())
            }
        }
        d.deserialize_any(V)
    }
}

/// A field of [`Fields`]: the integer or the (cut) string it holds.
struct Field(Option<u64>, Option<String>);

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Field, D::Error> {
        d.deserialize_any(loose(|v| match v {
            Scalar::U64(n) => Some(Field(Some(n), None)),
            Scalar::Str(s) => Some(Field(None, Some(capped(s)))),
            _ => None,
        }))
        .map(|f| f.unwrap_or(Field(None, None)))
    }
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
        while let Some(Key(key)) = map.next_key()? {
            match key.as_deref() {
                Some("traceEvents") => {
                    map.next_value_seed(EventsSeed(self.on_event))?;
                    *self.saw_events = true;
                }
                Some("deviceProperties") => {
                    map.next_value_seed(Devices(&mut self.meta.devices))?;
                }
                Some("distributedInfo") => {
                    let info = map.next_value::<Fields>()?;
                    self.meta.rank = info.num("rank");
                    self.meta.world_size = info.num("world_size");
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// Opens a trace file, transparently gunzipping it, at most to
/// [`gz_limit`] of its size.
pub fn open(path: &Path) -> Result<Box<dyn BufRead>, KinetoError> {
    let io = |source| KinetoError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    let mut f = BufReader::with_capacity(1 << 20, file);
    let gz = f.fill_buf().map_err(io)?.starts_with(&[0x1f, 0x8b]);
    Ok(if gz {
        Box::new(BufReader::with_capacity(
            1 << 20,
            Unpacked {
                inner: flate2::bufread::MultiGzDecoder::new(f),
                size,
                limit: gz_limit(size),
                total: 0,
            },
        ))
    } else {
        Box::new(f)
    })
}

/// What a gzip file of `size` bytes may unpack to.
pub fn gz_limit(size: u64) -> u64 {
    size.saturating_mul(GZ_MAX_RATIO).max(GZ_FREE)
}

/// Gzip output that fails once past `limit`, so that a small file cannot
/// make the parser buffer or import gigabytes.
struct Unpacked<R> {
    inner: R,
    size: u64,
    limit: u64,
    total: u64,
}

impl<R: Read> Read for Unpacked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // One byte past the limit is enough to know it was passed.
        let room = (self.limit + 1 - self.total).min(buf.len() as u64) as usize;
        let n = self.inner.read(&mut buf[..room])?;
        self.total += n as u64;
        if self.total > self.limit {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                TooLarge(format!(
                    "its gzip data unpacks to more than {} MiB, the most read from a {}-byte \
                     .gz ({GZ_MAX_RATIO} times its size, at least {} MiB; real traces unpack \
                     about 20 times); to read it anyway, gunzip it first",
                    self.limit >> 20,
                    self.size,
                    GZ_FREE >> 20,
                )),
            ));
        }
        Ok(n)
    }
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
    de.deserialize_map(top).map_err(|e| {
        let path = path.display().to_string();
        let reason = e.to_string();
        // A cap passed shows as the parser's I/O error: tell it apart from
        // a file that is not a trace at all.
        let too_large = e
            .is_io()
            .then(|| std::io::Error::from(e).into_inner())
            .flatten()
            .and_then(|inner| inner.downcast::<TooLarge>().ok());
        match too_large {
            Some(t) => KinetoError::TooLarge { path, reason: t.0 },
            None => KinetoError::Format { path, reason },
        }
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
        assert_eq!(
            us_text_to_ns("1.712195495505543e15"),
            Some(1_712_195_495_505_543_000)
        );
        assert_eq!(us_text_to_ns("0e30"), Some(0));
        assert_eq!(us_text_to_ns("1e-30"), Some(0));
    }

    #[test]
    fn huge_exponents_are_refused_before_any_digit_is_scaled() {
        // Unbounded, "0e2147483640" took 2 billion multiplications by ten
        // (1.8 s); a zero mantissa never overflows to stop them.
        for t in [
            "0e2147483640",
            "0E+2147483647",
            "1e31",
            "0e31",
            "1e-31",
            "5e-2147483648",
        ] {
            assert_eq!(us_text_to_ns(t), None, "{t}");
        }
        assert_eq!(us_text_to_ns("0e99999999999999999999"), None);
    }

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn events_with_huge_exponents_have_no_time() {
        let dir = tempfile::tempdir().unwrap();
        let event =
            r#"{"ph": "X", "cat": "kernel", "name": "k", "ts": 0e2147483640, "dur": 0e2147483640}"#;
        let text = format!("{{\"traceEvents\": [{}]}}", [event; 20].join(","));
        let p = write(dir.path(), "t.json", text.as_bytes());
        let mut n = 0;
        read_events(&p, |e| {
            assert_eq!((e.ts_ns(), e.dur_ns()), (None, None));
            n += 1;
        })
        .unwrap();
        assert_eq!(n, 20);
    }

    #[test]
    fn long_and_odd_fields_are_kept_small() {
        let dir = tempfile::tempdir().unwrap();
        let long = "é".repeat(MAX_TEXT); // twice the cap, in bytes
        let many: Vec<String> = (0..100_000).map(|i| i.to_string()).collect();
        let text = format!(
            r#"{{"{long}": 1, "deviceProperties": [5, {{"id": "0", "name": "A"}}, {{"id": 1, "name": 2}},
                  {{"id": 2, "id": 3, "name": "{long}", "big": [{many}]}}],
                "distributedInfo": {{"rank": [{many}], "world_size": 8}},
                "traceEvents": [{{"ph": "X", "cat": "kernel", "name": "{long}", "pid": [{many}],
                  "tid": "{long}", "ts": 1, "args": {{"name": "{long}", "grid": [1, 2, 3, {many}], "block": [4]}}}}]}}"#,
            many = many.join(",")
        );
        let p = write(dir.path(), "t.json", text.as_bytes());
        let mut events = Vec::new();
        let meta = read_events(&p, |e| events.push(e)).unwrap();
        let e = &events[0];
        assert!(e.name.len() <= MAX_TEXT && e.name.len() > MAX_TEXT - 4);
        assert!(e.name.chars().all(|c| c == 'é'));
        let args = e.args.as_ref().unwrap();
        assert_eq!(args.name.as_ref().unwrap().len(), e.name.len());
        assert_eq!(args.grid.as_deref(), Some(&[1, 2, 3][..]));
        assert_eq!(args.block.as_deref(), Some(&[4][..]));
        assert_eq!((e.pid_num(), e.tid_num()), (None, None));
        // Only whole (id, name) pairs count; the last of a repeated key wins.
        assert_eq!(meta.devices.len(), 1);
        assert_eq!(meta.devices[0].0, 3);
        assert_eq!(meta.devices[0].1, e.name);
        assert_eq!((meta.rank, meta.world_size), (None, Some(8)));
    }

    /// `members` gzip members back to back, each of `body` (a gzip file may
    /// hold several; readers join them).
    fn gzip_members(parts: &[(&[u8], usize)]) -> Vec<u8> {
        use std::io::Write;
        let mut out = Vec::new();
        for (body, times) in parts {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            gz.write_all(body).unwrap();
            let member = gz.finish().unwrap();
            for _ in 0..*times {
                out.extend_from_slice(&member);
            }
        }
        out
    }

    #[test]
    fn a_gzip_bomb_is_refused_at_its_cap() {
        // A 1 GiB kernel name from about 1 MB: it would be buffered whole
        // (3 GB); reading stops at the cap, GZ_FREE here.
        let dir = tempfile::tempdir().unwrap();
        let name = vec![b'a'; 1 << 20];
        let bytes = gzip_members(&[
            (
                br#"{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "name": ""#,
                1,
            ),
            (&name, 1024),
            (br#""}]}"#, 1),
        ]);
        assert!(bytes.len() < 2 << 20 && gz_limit(bytes.len() as u64) == GZ_FREE);
        let p = write(dir.path(), "bomb.json.gz", &bytes);
        let mut events = 0;
        let err = read_events(&p, |_| events += 1).unwrap_err();
        assert_eq!(events, 0);
        assert!(matches!(err, KinetoError::TooLarge { .. }), "{err}");
        let err = err.to_string();
        assert!(err.contains("refused") && err.contains("64 MiB"), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn the_gzip_cap_scales_with_the_file() {
        assert_eq!(gz_limit(0), GZ_FREE);
        assert_eq!(gz_limit(10 << 20), 500 << 20);
        assert_eq!(gz_limit(u64::MAX), u64::MAX);
        // Up to the cap reads; a byte more does not.
        let dir = tempfile::tempdir().unwrap();
        let head = br#"{"traceEvents": [{"ph": "X", "ts": 1}]"#;
        let pad = |n: usize| gzip_members(&[(head, 1), (&vec![b' '; n], 1), (b"}", 1)]);
        let p = write(dir.path(), "t.json.gz", &pad(0));
        read_events(&p, |_| {}).unwrap();
        let fits = GZ_FREE as usize - head.len() - 1;
        std::fs::write(&p, pad(fits)).unwrap();
        read_events(&p, |_| {}).unwrap();
        std::fs::write(&p, pad(fits + 1)).unwrap();
        assert!(matches!(
            read_events(&p, |_| {}),
            Err(KinetoError::TooLarge { .. })
        ));
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
        assert_eq!(meta.devices, [(0, "X".to_string())]);
        assert_eq!(meta.rank, Some(3));
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
