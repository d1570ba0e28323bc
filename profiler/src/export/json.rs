//! The report as JSON (`gapscope.report/1`, schema in docs/), with HTA's
//! per-stream table under `hta_per_stream` when it was asked for.

use std::io::{self, Write};

use super::{Options, View};

/// The report as a JSON value (for documents that hold several).
pub fn value(v: &View) -> serde_json::Value {
    let mut val = serde_json::to_value(&v.report).expect("report serializes");
    if let Some(h) = &v.analysis.hta {
        val["hta_per_stream"] = serde_json::to_value(h).expect("table serializes");
    }
    val
}

/// Keys in alphabetical order, wherever the report is written.
pub fn write(v: &View, _: &Options, mut out: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut out, &value(v))?;
    writeln!(out)
}
