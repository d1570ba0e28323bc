//! docs/report.schema.json is the `gapscope.report/1` contract: the reports
//! kept with the tests follow it, and it keeps its own rules (closed
//! objects, every field written and described) and the report code's names.
//! docs/diff.schema.json, `gapscope.diff/1`, and docs/ranks.schema.json,
//! `gapscope.ranks/1` (several inputs read as one job), keep the same rules
//! and the report's own definitions of what they share.

use std::path::Path;

use gapscope::analyze::cause::Cause;
use gapscope::timeline::OffKind;
use gapscope_tests::*;
use serde_json::Value;

fn def(name: &str) -> &'static Value {
    &report_schema()["$defs"][name]
}

/// The property names of a schema object, sorted.
fn property_names(schema: &Value) -> Vec<&str> {
    schema["properties"]
        .as_object()
        .expect("properties")
        .keys()
        .map(String::as_str)
        .collect()
}

fn sorted<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = names.into_iter().collect();
    v.sort_unstable();
    v
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|s| s.as_str().expect("a string"))
        .collect()
}

#[test]
fn the_golden_report_follows_the_schema() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/report.json");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_report_schema(&report);
    // And the check bites: a GPU's idle cause gone is named where it went.
    let mut broken = report.clone();
    broken["gpus"][0]["idle_by_cause_ns"]
        .as_object_mut()
        .unwrap()
        .remove("cpu.launch");
    assert_eq!(
        schema_violation(report_schema(), &broken),
        Err("$.gpus[0].idle_by_cause_ns[\"cpu.launch\"]: required, but missing".into())
    );
}

#[test]
fn the_report_of_each_pytorch_trace_follows_the_schema() {
    let dir = kineto_traces();
    let mut traces = 0;
    for name in file_names(&dir) {
        if !name.ends_with(".json.gz") {
            continue;
        }
        traces += 1;
        let path = dir.join(&name);
        let path = path.to_str().unwrap();
        for extra in [&[][..], &["--hta"][..]] {
            let mut args = vec!["report", "--format", "json", path];
            args.extend_from_slice(extra);
            let report: Value = serde_json::from_slice(&gapscope_stdout(&args)).unwrap();
            assert_eq!(report["schema"], "gapscope.report/1", "{name}");
            assert_eq!(report["hta_per_stream"].is_object(), !extra.is_empty());
            assert_report_schema(&report);
        }
    }
    assert!(traces >= 2, "no traces in {}", dir.display());
    // All of them at once: a report per rank inside gapscope.ranks/1.
    let ranks: Value = serde_json::from_slice(&gapscope_stdout(&[
        "report",
        "--format",
        "json",
        dir.to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(ranks["ranks"].as_array().unwrap().len(), traces);
    assert_reports_schema(&ranks);
}

/// Every object schema in `schema` is closed, requires its fields (but the
/// few serde leaves out when empty) and describes each of them; every `$ref`
/// resolves; an enum that may be null lists null.
fn check_rules(root: &Value, schema: &Value, at: &str, optional: &[&str]) {
    match schema {
        Value::Object(m) => {
            if let Some(r) = m.get("$ref") {
                let r = r.as_str().unwrap();
                assert!(
                    r.strip_prefix('#').and_then(|p| root.pointer(p)).is_some(),
                    "{at}: $ref {r} does not resolve"
                );
            }
            if let (Some(Value::Array(types)), Some(Value::Array(values))) =
                (m.get("type"), m.get("enum"))
            {
                assert_eq!(
                    types.contains(&"null".into()),
                    values.contains(&Value::Null),
                    "{at}: a nullable enum lists null, and only a nullable one"
                );
            }
            if let Some(props) = m.get("properties").and_then(Value::as_object) {
                assert_eq!(
                    m["additionalProperties"], false,
                    "{at}: an object the schema does not close"
                );
                let required = strings(&m["required"]);
                for (name, p) in props {
                    let field = format!("{at}.properties.{name}");
                    assert!(
                        p["description"].as_str().is_some_and(|d| !d.is_empty()),
                        "{field} has no description"
                    );
                    assert_eq!(
                        required.contains(&name.as_str()),
                        !optional.contains(&field.as_str()),
                        "{field}: serde writes every field but these: {optional:?}"
                    );
                }
                assert!(
                    required.iter().all(|r| props.contains_key(*r)),
                    "{at}: requires a field it does not define"
                );
            }
            for (k, v) in m {
                check_rules(root, v, &format!("{at}.{k}"), optional);
            }
        }
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, v)| check_rules(root, v, &format!("{at}[{i}]"), optional)),
        _ => {}
    }
}

#[test]
fn the_schema_keeps_its_own_rules() {
    let schema = report_schema();
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    check_rules(
        schema,
        schema,
        "$",
        &[
            // Written with --hta only.
            "$.properties.hta_per_stream",
            // HTA's buckets are left out when no gap fell in them.
            "$.$defs.StreamIdle.properties.host_wait",
            "$.$defs.StreamIdle.properties.kernel_wait",
            "$.$defs.StreamIdle.properties.other",
        ],
    );
}

#[test]
fn the_schema_uses_the_report_codes_names() {
    let schema = report_schema();
    assert_eq!(
        schema["properties"]["schema"]["const"],
        gapscope::export::SCHEMA
    );
    let causes = sorted(Cause::ALL.iter().map(|c| c.name()));
    assert_eq!(sorted(property_names(def("IdleByCause"))), causes);
    let mut topics: Vec<&str> = Cause::ALL
        .iter()
        .filter(|c| c.removable())
        .map(|c| c.name())
        .collect();
    topics.push("communication");
    assert_eq!(
        strings(&def("Recommendation")["properties"]["cause"]["enum"]),
        topics
    );
    let kinds: Vec<&str> = OffKind::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(sorted(property_names(def("OffCpu"))), sorted(kinds.clone()));
    assert_eq!(
        strings(&def("OffCpuStack")["properties"]["kind"]["enum"]),
        kinds
    );
}

/// A contract beside the report's: draft 2020-12, the same rules, its name
/// the code's, and the report's own definitions of what they share.
fn sibling_contract(schema: &Value, name: &str, shared: &[&str]) {
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    check_rules(schema, schema, "$", &[]);
    assert_eq!(schema["properties"]["schema"]["const"], name);
    for shared in shared {
        assert_eq!(schema["$defs"][shared], *def(shared), "{shared}");
    }
}

#[test]
fn the_diff_schema_keeps_the_same_rules_and_the_reports_definitions() {
    let schema = diff_schema();
    sibling_contract(
        schema,
        gapscope::export::diff::SCHEMA,
        &["IdleByCause", "BusyByKind"],
    );
    let causes = sorted(Cause::ALL.iter().map(|c| c.name()));
    assert_eq!(
        sorted(strings(
            &schema["$defs"]["CauseChange"]["properties"]["cause"]["enum"]
        )),
        causes
    );
}

#[test]
fn the_ranks_schema_keeps_the_same_rules_and_the_reports_definitions() {
    let schema = ranks_schema();
    sibling_contract(schema, gapscope::export::ranks::SCHEMA, &["IdleByCause"]);
    let mut removable: Vec<Value> = Cause::ALL
        .iter()
        .filter(|c| c.removable())
        .map(|c| c.name().into())
        .collect();
    removable.push(Value::Null);
    assert_eq!(
        schema["$defs"]["RankRow"]["properties"]["top_cause"]["enum"],
        Value::Array(removable)
    );
}
