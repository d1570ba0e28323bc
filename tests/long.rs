//! A long recording's report holds neither its GPU's work nor its feeder's
//! account whole: both are spooled (compressed, then into an unnamed
//! temporary file) and read back as the events and the what-if replays
//! reach them. Past what a spool keeps in memory, the report must still be
//! the one a reading of the whole session gives, number for number.

use std::process::Command;

use gapscope::analyze::{analyze, AnalyzeOptions};
use gapscope::export::{write, Format, Options, Subject, View};
use gapscope_tests::*;

fn json(a: &gapscope::analyze::Analysis) -> serde_json::Value {
    let mut out = Vec::new();
    write(
        Subject::Run(&View::new(a)),
        &Options::new(Format::Json),
        &mut out,
    )
    .unwrap();
    serde_json::from_slice(&out).unwrap()
}

#[test]
fn a_long_recording_spooled_reads_as_the_whole_session() {
    let dir = scratch("long");
    let path = dir.path().join("synthetic.gsz");
    // 1.5 M events: 0.46 M GPU records and 0.8 M moments of the feeder's
    // account, each spool several times what it keeps in memory.
    succeed(Command::new(bin("gs-synth")).arg(&path).arg("1500000"));
    let streamed = json(&analyze(path.clone(), &AnalyzeOptions::default()).unwrap());
    let whole = json(
        &analyze(
            gapscope::session::read_session(&path).unwrap(),
            &AnalyzeOptions {
                pictures: true,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    assert_eq!(whole, streamed);
    // Not vacuous: the job kept its GPU idle, a feeder fed it, and its
    // what-ifs were replayed.
    let gpu = &streamed["gpus"][0];
    assert!(u64_of(gpu, "idle_ns") > u64_of(gpu, "allocated_ns") / 10);
    let recs = streamed["recommendations"].as_array().unwrap();
    assert!(recs
        .iter()
        .any(|r| r["what_if"]["wall_ns"].as_u64().is_some()));

    // No temporary file can be made: the same report, held in memory, and
    // it says so.
    let out = succeed(
        Command::new(gapscope())
            .args(["report", "--format", "json"])
            .arg(&path)
            .env("TMPDIR", dir.path().join("missing")),
    );
    let mut in_memory: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let notes = in_memory["notes"].as_array_mut().unwrap();
    let said = notes
        .iter()
        .position(|n| {
            n.as_str()
                .unwrap()
                .contains("could not keep its scratch data")
        })
        .unwrap_or_else(|| panic!("no note on the scratch file: {notes:?}"));
    notes.remove(said);
    assert_eq!(in_memory, streamed);
}
