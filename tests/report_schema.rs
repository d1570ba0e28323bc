//! The `gapscope.report/1` contract, docs/report.schema.json, checked.
//!
//! A validator for exactly the JSON Schema (draft 2020-12) keywords that
//! schema uses: `type` (a name or a list of names), `const`, `enum`,
//! `properties`, `required`, `additionalProperties` (false or a schema),
//! `items`, `minimum`, `anyOf` and `$ref` to a place in the same document
//! (`#/$defs/...`). Annotations (`$schema`, `title`, `description`,
//! `$defs`) are skipped; any other keyword is a panic, so the schema cannot
//! use one that would silently go unchecked.

use std::sync::OnceLock;

use serde_json::Value;

const KEYWORDS: &[&str] = &[
    "$ref",
    "type",
    "const",
    "enum",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minimum",
    "anyOf",
];
const ANNOTATIONS: &[&str] = &["$schema", "title", "description", "$defs"];

/// docs/report.schema.json, parsed.
pub fn report_schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        serde_json::from_str(include_str!("../docs/report.schema.json"))
            .expect("docs/report.schema.json is JSON")
    })
}

/// docs/diff.schema.json, parsed.
pub fn diff_schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        serde_json::from_str(include_str!("../docs/diff.schema.json"))
            .expect("docs/diff.schema.json is JSON")
    })
}

/// docs/ranks.schema.json, parsed.
pub fn ranks_schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        serde_json::from_str(include_str!("../docs/ranks.schema.json"))
            .expect("docs/ranks.schema.json is JSON")
    })
}

/// Panics, naming the JSON path of the first violation, unless `diff`
/// follows docs/diff.schema.json.
#[track_caller]
pub fn assert_diff_schema(diff: &Value) {
    if let Err(e) = schema_violation(diff_schema(), diff) {
        panic!("the diff does not follow docs/diff.schema.json: {e}");
    }
}

/// Panics, naming the JSON path of the first violation, unless `report`
/// follows docs/report.schema.json.
#[track_caller]
pub fn assert_report_schema(report: &Value) {
    if let Err(e) = schema_violation(report_schema(), report) {
        panic!("the report does not follow docs/report.schema.json: {e}");
    }
}

/// What `gapscope report --format json` wrote, checked: the one report, or
/// with several inputs (`gapscope.ranks/1`) the whole of it and the report
/// of each rank.
#[track_caller]
pub fn assert_reports_schema(output: &Value) {
    if output["schema"] == "gapscope.ranks/1" {
        if let Err(e) = schema_violation(ranks_schema(), output) {
            panic!("the reports do not follow docs/ranks.schema.json: {e}");
        }
        for (i, rank) in output["ranks"]
            .as_array()
            .expect("ranks")
            .iter()
            .enumerate()
        {
            if let Err(e) = schema_violation(report_schema(), &rank["report"]) {
                panic!("the report of rank entry {i} does not follow docs/report.schema.json: {e}");
            }
        }
    } else {
        assert_report_schema(output);
    }
}

/// The first place `instance` breaks `schema`, as "PATH: what", where PATH
/// is a JSON path from `$` (`$.gpus[0].idle_by_cause_ns["input.io"]`).
/// `$ref`s resolve against `schema` itself.
pub fn schema_violation(schema: &Value, instance: &Value) -> Result<(), String> {
    check(schema, schema, instance, "$")
}

fn check(root: &Value, schema: &Value, v: &Value, path: &str) -> Result<(), String> {
    if let Some(b) = schema.as_bool() {
        return match b {
            true => Ok(()),
            false => Err(format!("{path}: not allowed here")),
        };
    }
    let schema = schema
        .as_object()
        .unwrap_or_else(|| panic!("a schema must be an object or a boolean: {schema}"));
    for k in schema.keys() {
        assert!(
            KEYWORDS.contains(&k.as_str()) || ANNOTATIONS.contains(&k.as_str()),
            "the schema uses {k:?}, which this validator does not implement"
        );
    }
    if let Some(r) = schema.get("$ref") {
        let target = r
            .as_str()
            .and_then(|r| r.strip_prefix('#'))
            .and_then(|pointer| root.pointer(pointer))
            .unwrap_or_else(|| panic!("$ref {r} does not resolve in this document"));
        check(root, target, v, path)?;
    }
    if let Some(any) = schema.get("anyOf") {
        let options = any.as_array().expect("anyOf is an array");
        let errors: Vec<String> = options
            .iter()
            .filter_map(|s| check(root, s, v, path).err())
            .collect();
        if errors.len() == options.len() {
            return Err(errors.join("; and "));
        }
    }
    if let Some(t) = schema.get("type") {
        let names: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => panic!("bad type {t}"),
        };
        if !names.iter().any(|n| is_type(v, n)) {
            return Err(format!("{path}: {} is not of type {}", brief(v), t));
        }
    }
    if let Some(c) = schema.get("const") {
        if v != c {
            return Err(format!("{path}: {} is not {c}", brief(v)));
        }
    }
    if let Some(e) = schema.get("enum") {
        let values = e.as_array().expect("enum is an array");
        if !values.contains(v) {
            return Err(format!("{path}: {} is not one of {e}", brief(v)));
        }
    }
    if let (Some(min), Value::Number(n)) = (schema.get("minimum"), v) {
        let min = min.as_number().expect("minimum is a number");
        if below(n, min) {
            return Err(format!("{path}: {n} is less than the minimum {min}"));
        }
    }
    if let Value::Object(fields) = v {
        let props = schema.get("properties").and_then(Value::as_object);
        if let Some(required) = schema.get("required") {
            for name in required.as_array().expect("required is an array") {
                let name = name.as_str().expect("required names are strings");
                if !fields.contains_key(name) {
                    return Err(format!("{}: required, but missing", child_path(path, name)));
                }
            }
        }
        for (name, value) in fields {
            let at = child_path(path, name);
            match props.and_then(|p| p.get(name)) {
                Some(s) => check(root, s, value, &at)?,
                None => match schema.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        return Err(format!("{at}: not a property the schema allows"))
                    }
                    Some(s) => check(root, s, value, &at)?,
                    None => {}
                },
            }
        }
    }
    if let (Some(items), Value::Array(a)) = (schema.get("items"), v) {
        for (i, item) in a.iter().enumerate() {
            check(root, items, item, &format!("{path}[{i}]"))?;
        }
    }
    Ok(())
}

fn is_type(v: &Value, name: &str) -> bool {
    match name {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        // As the spec has it, 1.0 is an integer too.
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => panic!("unknown type name {name:?}"),
    }
}

/// `n < min`, exactly for integers of either sign.
fn below(n: &serde_json::Number, min: &serde_json::Number) -> bool {
    let int = |x: &serde_json::Number| {
        x.as_i64()
            .map(i128::from)
            .or_else(|| x.as_u64().map(i128::from))
    };
    match (int(n), int(min)) {
        (Some(a), Some(b)) => a < b,
        _ => n.as_f64().unwrap_or(f64::NAN) < min.as_f64().unwrap_or(f64::NAN),
    }
}

/// `$.a.b`, or `$.a["input.io"]` where the key is not a plain name.
fn child_path(path: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && !key.starts_with(|c: char| c.is_ascii_digit())
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain {
        format!("{path}.{key}")
    } else {
        format!("{path}[{}]", Value::from(key))
    }
}

/// A value as a message shows it: short ones whole, long ones by type.
fn brief(v: &Value) -> String {
    let s = v.to_string();
    if s.len() <= 60 {
        return s;
    }
    match v {
        Value::Object(_) => "an object".into(),
        Value::Array(a) => format!("an array of {}", a.len()),
        _ => format!("{}...", s.chars().take(57).collect::<String>()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A small schema in the report's style.
    fn schema() -> Value {
        json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["mode", "gpus", "rank"],
            "properties": {
                "mode": {"type": "string", "enum": ["run", "attach"]},
                "gpus": {"type": "array", "items": {"$ref": "#/$defs/Gpu"}},
                "rank": {"type": ["integer", "null"], "minimum": 0},
                "hta": {"type": "object", "additionalProperties": {"type": "integer"}}
            },
            "$defs": {
                "Gpu": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["id", "idle"],
                    "properties": {
                        "id": {"type": "integer", "minimum": 0},
                        "idle": {"type": "object", "additionalProperties": false,
                                 "required": ["input.io"],
                                 "properties": {"input.io": {"type": "integer"}}}
                    }
                }
            }
        })
    }

    fn good() -> Value {
        json!({"mode": "run", "gpus": [{"id": 0, "idle": {"input.io": 5}}], "rank": null,
               "hta": {"7": 3}})
    }

    fn violation(v: Value) -> String {
        schema_violation(&schema(), &v).expect_err("should not validate")
    }

    #[test]
    fn a_good_instance_passes() {
        assert_eq!(schema_violation(&schema(), &good()), Ok(()));
        let mut v = good();
        v["rank"] = json!(3);
        assert_eq!(schema_violation(&schema(), &v), Ok(()));
    }

    #[test]
    fn a_missing_required_field_is_named_by_its_path() {
        let mut v = good();
        v["gpus"][0].as_object_mut().unwrap().remove("id");
        assert_eq!(violation(v), "$.gpus[0].id: required, but missing");
        let mut v = good();
        v["gpus"][0]["idle"] = json!({});
        assert_eq!(
            violation(v),
            "$.gpus[0].idle[\"input.io\"]: required, but missing"
        );
    }

    #[test]
    fn an_extra_field_is_named_by_its_path() {
        let mut v = good();
        v["gpus"][0]["extra"] = json!(1);
        assert_eq!(
            violation(v),
            "$.gpus[0].extra: not a property the schema allows"
        );
    }

    #[test]
    fn a_wrong_type_is_named_by_its_path() {
        let mut v = good();
        v["gpus"][0]["id"] = json!("0");
        assert_eq!(
            violation(v),
            "$.gpus[0].id: \"0\" is not of type \"integer\""
        );
        let mut v = good();
        v["gpus"][0]["id"] = json!(1.5);
        assert_eq!(violation(v), "$.gpus[0].id: 1.5 is not of type \"integer\"");
        let mut v = good();
        v["rank"] = json!("3");
        assert_eq!(
            violation(v),
            "$.rank: \"3\" is not of type [\"integer\",\"null\"]"
        );
        let mut v = good();
        v["hta"]["7"] = json!(null);
        assert_eq!(
            violation(v),
            "$.hta[\"7\"]: null is not of type \"integer\""
        );
    }

    #[test]
    fn a_bad_enum_value_is_named_by_its_path() {
        let mut v = good();
        v["mode"] = json!("Run");
        assert_eq!(
            violation(v),
            "$.mode: \"Run\" is not one of [\"run\",\"attach\"]"
        );
    }

    #[test]
    fn minimum_and_const_hold() {
        let mut v = good();
        v["gpus"][0]["id"] = json!(-1);
        assert_eq!(violation(v), "$.gpus[0].id: -1 is less than the minimum 0");
        let c = json!({"const": "gapscope.report/1"});
        assert_eq!(schema_violation(&c, &json!("gapscope.report/1")), Ok(()));
        assert_eq!(
            schema_violation(&c, &json!("gapscope.ranks/1")).unwrap_err(),
            "$: \"gapscope.ranks/1\" is not \"gapscope.report/1\""
        );
        assert!(!below(
            &serde_json::Number::from(u64::MAX),
            &serde_json::Number::from(0)
        ));
    }

    #[test]
    #[should_panic(expected = "does not implement")]
    fn a_keyword_the_validator_does_not_know_is_refused() {
        let _ = schema_violation(&json!({"maximum": 3}), &json!(1));
    }

    #[test]
    fn the_report_schema_parses() {
        assert_eq!(
            report_schema()["properties"]["schema"]["const"],
            "gapscope.report/1"
        );
    }
}
