//! The protocol module's unit tests.

use super::agent_line::*;
use super::envelope::*;
use super::error::*;
use super::lines::*;
use super::meta::*;
use serde_json::value::RawValue;
use std::borrow::Cow;

#[test]
fn method_and_version_are_borrowed_unless_escaped() {
    let line = br#"{"jsonrpc":"2.0","id":1,"method":"a\/b","params":{"x":1}}"#;
    let (envelope, _) = Envelope::parse(line, true).expect("request");
    assert!(matches!(envelope.jsonrpc, Some(Cow::Borrowed("2.0"))));
    assert!(matches!(envelope.method, Some(Cow::Owned(ref m)) if m == "a/b"));
    let (message, _) = AgentMessage::parse(br#"{"jsonrpc":"2.0","method":"m"}"#).expect("ok");
    assert!(matches!(message.method, Some(Cow::Borrowed("m"))));
    // null is absent, another type the same error as before.
    let (envelope, _) = Envelope::parse(
        br#"{"jsonrpc":"2.0","id":1,"method":null,"result":1}"#,
        true,
    )
    .expect("response");
    assert_eq!(envelope.method, None);
    let error = Envelope::parse(br#"{"jsonrpc":"2.0","method":5}"#, true).expect_err("5");
    assert!(error.to_string().contains("expected a string"), "{error}");
    // The owned copy gives back the same members.
    let owned = OwnedEnvelope::new(&Envelope::parse(line, true).expect("request").0);
    let again = owned.envelope();
    assert_eq!(again.method(), "a/b");
    assert_eq!(again.id.map(RawValue::get), Some("1"));
    assert_eq!(again.params.map(RawValue::get), Some(r#"{"x":1}"#));
    assert_eq!(again.jsonrpc.as_deref(), Some("2.0"));
}

#[test]
fn classifies_the_three_kinds() {
    let (_, kind) =
        Envelope::parse(br#"{"jsonrpc":"2.0","id":1,"method":"x"}"#, true).expect("request");
    assert_eq!(kind, Kind::Request);
    let (_, kind) =
        Envelope::parse(br#"{"jsonrpc":"2.0","method":"x"}"#, true).expect("notification");
    assert_eq!(kind, Kind::Notification);
    let (_, kind) =
        Envelope::parse(br#"{"jsonrpc":"2.0","id":"a","result":null}"#, true).expect("response");
    assert_eq!(kind, Kind::Response);
}

#[test]
fn a_member_named_twice_in_params_is_refused() {
    for params in [
        r#"{"sessionId":"x","prompt":[],"sessionId":"ended"}"#,
        r#"{"sessionId":"s","sessi\u006fnId":"t"}"#,
        r#"{"_meta":{"traceparent":"a"},"_meta":"s"}"#,
        r#"{"sessionId":"s","sessionId":"s","prompt":[{"type":"text","text":"hi"}]}"#,
        r#"{"sessionId":"s","_meta":{"traceparent":"a","traceparent":"a"},"prompt":[]}"#,
        r#"{"_meta":{"sandboxagent.dev":{"agent":"mock","agent":"mock"}}}"#,
        r#"{"prompt":[{"type":"text","text":"a","text":"a"}]}"#,
        r#"{"a":{"b":[{"c":{"d":1,"e":2,"d":1}}]}}"#,
    ] {
        let line = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{params}}}"#);
        let error = Envelope::parse(line.as_bytes(), true).expect_err(params);
        assert!(
            matches!(error, EnvelopeError::DuplicateMember(_)),
            "{params}: {error}"
        );
    }
    // Nested objects may repeat names of the top level, and agent output
    // is relayed as it is.
    let nested = br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":{"a":1,"b":{"a":2}},"b":[{"a":1},{"a":1}],"c":{}}}"#;
    Envelope::parse(nested, true).expect("nested names");
    // Members of the message itself, and past the scanned names of a
    // large object (where a set takes over).
    let top = br#"{"jsonrpc":"2.0","id":1,"method":"x","x":1,"x":1}"#;
    assert!(matches!(
        Envelope::parse(top, true),
        Err(EnvelopeError::DuplicateMember(name)) if name == "x"
    ));
    let many: Vec<String> = (0..100).map(|n| format!(r#""m{n}":{n}"#)).collect();
    let wide = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{{{}}}}}"#,
        many.join(",")
    );
    Envelope::parse(wide.as_bytes(), true).expect("100 names, each once");
    let wide_twice = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{{{},"m7":0,"z":1}}}}"#,
        many.join(",")
    );
    assert!(matches!(
        Envelope::parse(wide_twice.as_bytes(), true),
        Err(EnvelopeError::DuplicateMember(name)) if name == "m7"
    ));
    let twice = br#"{"jsonrpc":"2.0","method":"x","params":{"a":1,"a":2}}"#;
    Envelope::parse(twice, false).expect("agent output is not checked");
}

/// A request whose params hold `value` (raw JSON).
fn request_with(value: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{{"v":{value}}}}}"#)
}

#[test]
fn what_serde_json_cannot_decode_is_refused_and_the_rest_passes() {
    let cases = [
        (r#""emoji cut in half: \ud83d""#, false),
        (r#""\ud83d\ude00 whole emoji""#, true),
        (r#""low half alone \uDE00""#, false),
        (r#""high then text \ud83dx""#, false),
        (r#""high then other escape \ud83d\n""#, false),
        (r#""escaped backslash then u: \\ud83d""#, true),
        (r#""\u00e9 and \uFFFF""#, true),
        (r#"["\"quoted\" {[", "]}"]"#, true),
        ("1e400", false),
        ("-1e309", false),
        (&"9".repeat(400), false),
        ("18446744073709551616", true),
        ("-9223372036854775809", true),
        ("1.5e-400", true),
        ("[-0, 0.5, 1E+2, 12345678901234567890]", true),
    ];
    for (value, decodable) in cases {
        let body = request_with(value);
        let serde_ok = serde_json::from_str::<serde_json::Value>(&body).is_ok();
        assert_eq!(
            serde_ok, decodable,
            "serde_json and the case disagree: {body}"
        );
        let parsed = Envelope::parse(body.as_bytes(), true);
        assert_eq!(parsed.is_ok(), decodable, "{body}: {parsed:?}");
        if let Err(error) = parsed {
            let text = error.to_string();
            assert!(
                text.contains("surrogate") || text.contains("out of range"),
                "{text}"
            );
        }
    }
    // The request object and params take two levels; `v` the rest.
    for depth in [MAX_DEPTH - 3, MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH] {
        let body = request_with(&format!("{}{}", "[".repeat(depth), "]".repeat(depth)));
        let serde_ok = serde_json::from_str::<serde_json::Value>(&body).is_ok();
        let parsed = Envelope::parse(body.as_bytes(), true);
        assert_eq!(parsed.is_ok(), serde_ok, "depth {depth}: {parsed:?}");
    }
    let deep = request_with(&format!("{}{}", "[".repeat(200), "]".repeat(200)));
    let error = Envelope::parse(deep.as_bytes(), true).expect_err("too deep");
    assert!(error.to_string().contains("nested deeper"), "{error}");
    // Agent lines are relayed, not judged.
    assert!(Envelope::parse(request_with(r#""\ud83d""#).as_bytes(), false).is_ok());
}

#[test]
fn keeps_explicit_null_id_apart_from_missing_id() {
    let (envelope, kind) =
        Envelope::parse(br#"{"jsonrpc":"2.0","id":null,"method":"x"}"#, true).expect("null id");
    assert_eq!(kind, Kind::Request);
    assert_eq!(envelope.id.map(RawValue::get), Some("null"));
}

#[test]
fn ids_round_trip_verbatim() {
    for id in [
        "9007199254740993",
        "\"a\\u0062c\"",
        "-0",
        "18446744073709551616",
    ] {
        let text = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"m","params":{{}}}}"#);
        let (envelope, _) = Envelope::parse(text.as_bytes(), true).expect("parse");
        let id_raw = envelope.id.expect("id");
        assert_eq!(id_raw.get(), id);
        let line = result_response_line(id_raw, &serde_json::json!({}));
        let text = String::from_utf8(line).expect("utf8");
        assert!(text.contains(&format!(r#""id":{id}"#)), "{text}");
    }
}

#[test]
fn rejects_bad_shapes() {
    let cases: &[(&[u8], EnvelopeError)] = &[
        (
            b"[]",
            EnvelopeError::NotJson("batches (arrays) are not supported".into()),
        ),
        (b"", EnvelopeError::NotJson("empty body".into())),
        (
            b"\"x\"",
            EnvelopeError::NotJson("expected an object".into()),
        ),
        (br#"{"id":1,"method":"x"}"#, EnvelopeError::Version),
        (br#"{"jsonrpc":"2.0","id":1}"#, EnvelopeError::Shape),
        (
            br#"{"jsonrpc":"2.0","id":1,"result":1,"error":{}}"#,
            EnvelopeError::Shape,
        ),
        (
            br#"{"jsonrpc":"2.0","id":{},"method":"x"}"#,
            EnvelopeError::Id,
        ),
        (
            br#"{"jsonrpc":"2.0","id":true,"method":"x"}"#,
            EnvelopeError::Id,
        ),
        (
            br#"{"jsonrpc":"2.0","method":"x","params":3}"#,
            EnvelopeError::Params,
        ),
        (
            br#"{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":["s",[]]}"#,
            EnvelopeError::ParamsArray,
        ),
        (
            br#"{"jsonrpc":"2.0","method":"x","params": []}"#,
            EnvelopeError::ParamsArray,
        ),
    ];
    for (bytes, expected) in cases {
        let error = Envelope::parse(bytes, true).expect_err("must fail");
        assert_eq!(&error, expected, "{}", String::from_utf8_lossy(bytes));
    }
    assert!(matches!(
        Envelope::parse(b"{not json", true),
        Err(EnvelopeError::NotJson(_))
    ));
}

#[test]
fn reads_session_id_and_meta_agent() {
    let (envelope, _) = Envelope::parse(
        br#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{"x":[1,2]},"sessionId":"s-1"}}"#,
        true,
    )
    .expect("parse");
    assert_eq!(envelope.session_id().as_deref(), Some("s-1"));
    let params = RawValue::from_string(
        r#"{"cwd":"/","_meta":{"other":1,"sandboxagent.dev":{"agent":"mock","title":"t"}}}"#
            .to_owned(),
    )
    .expect("raw");
    assert_eq!(meta_agent(Some(&params)).as_deref(), Some("mock"));
    let params =
        RawValue::from_string(r#"{"_meta":{"sandboxagent.dev":{}}}"#.to_owned()).expect("raw");
    assert_eq!(meta_agent(Some(&params)), None);
}

#[test]
fn agent_message_peeks_into_params_in_one_pass() {
    let line = br#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{"content":{"text":"x"},"sessionUpdate":"agent_message_chunk"},"sessionId":"s-1"}}"#;
    let (message, kind) = AgentMessage::parse(line).expect("parse");
    assert_eq!(kind, Kind::Notification);
    assert_eq!(message.session_id(), Some("s-1"));
    assert_eq!(message.update_kind(), Some("agent_message_chunk"));
    assert!(matches!(
        message.params.as_ref().and_then(|p| p.session_id.as_ref()),
        Some(Cow::Borrowed(_))
    ));
    let (cancel, _) = AgentMessage::parse(
        br#"{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"r 1"}}"#,
    )
    .expect("parse");
    assert_eq!(
        cancel.cancelled_request_id().map(RawValue::get),
        Some(r#""r 1""#)
    );
}

#[test]
fn agent_message_params_of_other_shapes_are_relayed_not_rejected() {
    for line in [
        &br#"{"jsonrpc":"2.0","method":"x","params":[1,{"sessionId":"s"}]}"#[..],
        br#"{"jsonrpc":"2.0","method":"x","params":{"sessionId":5,"update":"text"}}"#,
        br#"{"jsonrpc":"2.0","method":"x","params":{"sessionId":{"a":[]},"update":{"sessionUpdate":7}}}"#,
        br#"{"jsonrpc":"2.0","method":"x","params":null}"#,
        br#"{"jsonrpc":"2.0","method":"x","params":"str"}"#,
    ] {
        let (message, kind) = AgentMessage::parse(line).expect("lenient");
        assert_eq!(kind, Kind::Notification);
        assert_eq!(message.session_id(), None);
        assert_eq!(message.update_kind(), None);
    }
    let (escaped, _) =
        AgentMessage::parse(br#"{"jsonrpc":"2.0","method":"x","params":{"sessionId":"a\u0062"}}"#)
            .expect("parse");
    assert_eq!(escaped.session_id(), Some("ab"));
    assert!(AgentMessage::parse(b"[1]").is_err());
    assert!(AgentMessage::parse(br#"{"jsonrpc":"2.0","id":1}"#).is_err());
    assert!(
        AgentMessage::parse(br#"{"jsonrpc":"2.0","method":"x","params":{"sessionId":"s""#).is_err()
    );
}

#[test]
fn agent_messages_must_be_json_rpc_2_0() {
    for line in [
        &br#"{"id":3,"result":{"stopReason":"refusal"}}"#[..],
        br#"{"jsonrpc":"1.0","id":3,"result":{}}"#,
        br#"{"jsonrpc":2,"id":3,"result":{}}"#,
        br#"{"level":"info","id":3,"msg":"x","result":"logged"}"#,
        br#"{"method":"session/update","params":{}}"#,
    ] {
        let error = AgentMessage::parse(line).expect_err("not JSON-RPC 2.0");
        assert!(
            matches!(error, EnvelopeError::Version | EnvelopeError::NotJson(_)),
            "{error:?}"
        );
    }
    let (_, kind) = AgentMessage::parse(br#"{"jsonrpc":"2.0","id":3,"result":{}}"#).expect("2.0");
    assert_eq!(kind, Kind::Response);
}

#[test]
fn flattens_newlines_outside_strings() {
    let mut bytes = b"{\n\"a\":\r\n\"b\\nc\"}".to_vec();
    flatten_newlines(&mut bytes);
    let value: serde_json::Value = serde_json::from_slice(&bytes).expect("still JSON");
    assert_eq!(value["a"], "b\nc");
    assert!(!has_newline(&bytes));
}
