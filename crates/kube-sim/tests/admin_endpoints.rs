//! The `/_sim/*` admin endpoints (issue 15): with authentication on they answer only a
//! `system:masters` identity (401 without credentials, 403 for anyone else), and out-of-range
//! fault values are refused with a 400 naming the field instead of panicking the server.

mod common;

use kube_sim::auth::{AuthConfig, StaticToken};
use kube_sim::rbac::UserInfo;
use serde_json::Value;

async fn post(client: &kube::Client, path: &str, body: &str) -> Result<String, kube::Error> {
    let request = http::Request::post(path)
        .header("content-type", "application/json")
        .body(body.as_bytes().to_vec())
        .expect("request");
    client.request_text(request).await
}

#[tokio::test]
async fn admin_endpoints_need_an_admin_identity_when_authentication_is_on() {
    let sim = common::start_with(kube_sim::Config {
        auth: AuthConfig {
            rbac: true,
            static_tokens: vec![StaticToken {
                token: "alice-token".into(),
                user: UserInfo::new("alice", &["dev"]),
            }],
            ..Default::default()
        },
        ..Default::default()
    })
    .await;

    let (code, body) =
        common::raw_json(&sim, "POST", "/_sim/watches/cut", "application/json", "").await;
    assert_eq!((code, body["reason"].as_str()), (401, Some("Unauthorized")));
    let (code, _) = common::raw_json(&sim, "GET", "/_sim/faults", "application/json", "").await;
    assert_eq!(code, 401, "reads are the admin's too");

    let alice = sim.client_with_token("alice-token").expect("alice");
    match post(&alice, "/_sim/faults", r#"{"latencyMs": 5}"#).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403);
            assert_eq!(
                status.message,
                "forbidden: User \"alice\" cannot post path \"/_sim/faults\""
            );
        }
        other => panic!("alice must be refused: {other:?}"),
    }
    let admin = sim.client().expect("admin client");
    let latency = |text: String| -> Value {
        serde_json::from_str::<Value>(&text).expect("json")["latencyMs"].clone()
    };
    let get = || {
        let admin = admin.clone();
        async move {
            admin
                .request_text(
                    http::Request::get("/_sim/faults")
                        .body(Vec::new())
                        .expect("request"),
                )
                .await
                .expect("the admin may read")
        }
    };
    assert_eq!(latency(get().await), 0, "a refused request changes nothing");
    post(&admin, "/_sim/faults", r#"{"latencyMs": 5}"#)
        .await
        .expect("the admin may");
    assert_eq!(latency(get().await), 5);
}

#[tokio::test]
async fn admin_endpoints_stay_open_without_authentication() {
    let sim = common::start().await;
    let (code, _) =
        common::raw_json(&sim, "POST", "/_sim/watches/cut", "application/json", "").await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn out_of_range_fault_values_are_refused_naming_the_field() {
    let sim = common::start().await;
    let cases = [
        (
            "/_sim/faults",
            r#"{"errors":[{"rate":1.5}]}"#,
            "errors[0].rate",
        ),
        (
            "/_sim/faults",
            r#"{"errors":[{"rate":0.1},{"rate":-0.5}]}"#,
            "errors[1].rate",
        ),
        (
            "/_sim/faults",
            r#"{"errors":[{"rate":0.5,"code":200}]}"#,
            "errors[0].code",
        ),
        (
            "/_sim/faults",
            r#"{"watchMaxSeconds":1e300}"#,
            "watchMaxSeconds",
        ),
        (
            "/_sim/faults",
            r#"{"watchMaxSeconds":-1}"#,
            "watchMaxSeconds",
        ),
        (
            "/_sim/faults",
            r#"{"latencyMs":18446744073709551615}"#,
            "latencyMs",
        ),
        (
            "/_sim/faults",
            r#"{"latencyJitterMs":18446744073709551615}"#,
            "latencyJitterMs",
        ),
        (
            "/_sim/faults",
            r#"{"watchResumeGoneRate":2}"#,
            "watchResumeGoneRate",
        ),
        ("/_sim/partition", r#"{"seconds":1e300}"#, "seconds"),
        ("/_sim/partition", r#"{"seconds":-3}"#, "seconds"),
        ("/_sim/partition", r#"{"seconds":"soon"}"#, "seconds"),
    ];
    for (path, body, field) in cases {
        let (code, status) = common::raw_json(&sim, "POST", path, "application/json", body).await;
        assert_eq!(code, 400, "{path} {body}: {status}");
        let message = status["message"].as_str().unwrap_or_default();
        assert!(message.contains(&format!("{field}: ")), "{body}: {message}");
        assert_eq!(status["reason"], "BadRequest");
    }
    // Nothing was applied and the server still serves.
    let (code, faults) =
        common::raw_json(&sim, "GET", "/_sim/faults", "application/json", "").await;
    assert_eq!(code, 200);
    assert_eq!(faults["latencyMs"], Value::from(0));
    assert_eq!(faults["errors"], Value::Array(vec![]));
    let (code, _) =
        common::raw_json(&sim, "GET", "/api/v1/namespaces", "application/json", "").await;
    assert_eq!(code, 200, "not partitioned");
}
