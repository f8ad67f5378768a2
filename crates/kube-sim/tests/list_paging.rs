//! Lists as kube-apiserver serves them (issue 12): pages of a continued list are one consistent
//! snapshot at the first page's resourceVersion, even under concurrent writes; a continue token
//! whose version left the history is `410 Expired`; `resourceVersionMatch` Exact and
//! NotOlderThan are honoured.

mod common;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, ObjectList, PostParams, VersionMatch};
use serde_json::json;
use std::collections::BTreeMap;

fn cm(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": value}}))
        .expect("configmap")
}

fn value_of(c: &ConfigMap) -> String {
    c.data
        .as_ref()
        .and_then(|d| d.get("v"))
        .cloned()
        .unwrap_or_default()
}

fn rv(list: &ObjectList<ConfigMap>) -> String {
    list.metadata
        .resource_version
        .clone()
        .expect("list resourceVersion")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continued_pages_are_one_snapshot_under_concurrent_writes() {
    let sim = common::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.client().expect("client"), "default");
    for i in 0..30 {
        cms.create(
            &PostParams::default(),
            &cm(&format!("cm-{i:02}"), "original"),
        )
        .await
        .expect("create");
    }
    let first = cms
        .list(&ListParams::default().limit(10))
        .await
        .expect("page 1");
    let snapshot_rv = rv(&first);

    // A writer changes, adds and deletes objects on both sides of the paging cursor meanwhile.
    let writer = {
        let cms = cms.clone();
        tokio::spawn(async move {
            for round in 0..20 {
                let name = format!("cm-{:02}", (round * 7) % 30);
                let mut changed = cms.get(&name).await.expect("get");
                changed.data = Some(BTreeMap::from([("v".into(), format!("changed-{round}"))]));
                cms.replace(&name, &PostParams::default(), &changed)
                    .await
                    .expect("update");
                cms.create(
                    &PostParams::default(),
                    &cm(&format!("cm-{round:02}-new"), "new"),
                )
                .await
                .expect("create");
            }
            cms.delete("cm-29", &DeleteParams::default())
                .await
                .expect("delete");
            cms.delete("cm-05", &DeleteParams::default())
                .await
                .expect("delete");
        })
    };
    let mut seen: Vec<ConfigMap> = first.items.clone();
    let mut token = first.metadata.continue_.clone();
    while let Some(t) = token.filter(|t| !t.is_empty()) {
        let page = cms
            .list(&ListParams::default().limit(10).continue_token(&t))
            .await
            .expect("next page");
        assert_eq!(
            rv(&page),
            snapshot_rv,
            "every page reports the first page's version"
        );
        seen.extend(page.items.clone());
        token = page.metadata.continue_.clone();
    }
    writer.await.expect("writer");
    // And a page read after every write has landed still shows the snapshot.
    let late = cms
        .list(
            &ListParams::default().limit(10).continue_token(
                first
                    .metadata
                    .continue_
                    .as_deref()
                    .expect("more than one page"),
            ),
        )
        .await
        .expect("page 2 again");
    assert!(late.items.iter().all(|c| value_of(c) == "original"));
    assert_eq!(
        late.items
            .first()
            .and_then(|c| c.metadata.name.clone())
            .as_deref(),
        Some("cm-10")
    );

    let names: Vec<String> = seen
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    let expected: Vec<String> = (0..30).map(|i| format!("cm-{i:02}")).collect();
    assert_eq!(
        names, expected,
        "exactly the objects of the first page's version"
    );
    assert!(
        seen.iter().all(|c| value_of(c) == "original"),
        "no later content"
    );
    let now = cms.list(&ListParams::default()).await.expect("fresh list");
    assert_eq!(now.items.len(), 30 + 20 - 2, "a fresh list sees the writes");
}

#[tokio::test]
async fn a_continue_token_out_of_the_history_is_410_expired() {
    let sim = common::start_with(kube_sim::Config {
        history_size: 5,
        ..Default::default()
    })
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.client().expect("client"), "default");
    for i in 0..4 {
        cms.create(&PostParams::default(), &cm(&format!("a-{i}"), "x"))
            .await
            .expect("create");
    }
    let first = cms
        .list(&ListParams::default().limit(2))
        .await
        .expect("page 1");
    let token = first.metadata.continue_.clone().expect("continue");
    for i in 0..10 {
        cms.create(&PostParams::default(), &cm(&format!("b-{i}"), "x"))
            .await
            .expect("create");
    }
    match cms
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
            assert_eq!(
                status.message,
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list."
            );
        }
        other => panic!("expected 410 Expired, got {other:?}"),
    }
    let (code, status) = common::raw_json(
        &sim,
        "GET",
        "/api/v1/namespaces/default/configmaps?limit=2&continue=%25%25",
        "application/json",
        "",
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(
        status["message"],
        "continue key is not valid: illegal base64 data at input byte 0"
    );
}

#[tokio::test]
async fn resource_version_match_exact_and_not_older_than() {
    let sim = common::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.client().expect("client"), "default");
    cms.create(&PostParams::default(), &cm("a", "one"))
        .await
        .expect("create");
    let then = rv(&cms.list(&ListParams::default()).await.expect("list"));
    let mut a = cms.get("a").await.expect("get");
    a.data = Some(BTreeMap::from([("v".into(), "two".into())]));
    cms.replace("a", &PostParams::default(), &a)
        .await
        .expect("update");
    cms.create(&PostParams::default(), &cm("b", "one"))
        .await
        .expect("create b");

    let exact = cms
        .list(
            &ListParams::default()
                .at(&then)
                .matching(VersionMatch::Exact),
        )
        .await
        .expect("exact");
    assert_eq!(rv(&exact), then);
    assert_eq!(exact.items.len(), 1, "b did not exist yet");
    assert_eq!(value_of(&exact.items[0]), "one");

    let newer = cms
        .list(
            &ListParams::default()
                .at(&then)
                .matching(VersionMatch::NotOlderThan),
        )
        .await
        .expect("not older than");
    assert!(rv(&newer).parse::<u64>().expect("rv") > then.parse::<u64>().expect("rv"));
    assert_eq!(newer.items.len(), 2);
    assert!(newer.items.iter().any(|c| value_of(c) == "two"));

    let (code, status) = common::raw_json(
        &sim,
        "GET",
        "/api/v1/namespaces/default/configmaps?resourceVersion=1&resourceVersionMatch=Exact",
        "application/json",
        "",
    )
    .await;
    assert_eq!(code, 200, "the whole history is kept here: {status}");
    assert_eq!(status["items"], json!([]), "nothing existed at version 1");
}
