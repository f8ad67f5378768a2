//! Small helpers on object metadata (finalizers, deletion) shared by every controller's decisions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// True when `meta` carries `finalizer`.
pub fn has_finalizer(meta: &ObjectMeta, finalizer: &str) -> bool {
    meta.finalizers
        .as_ref()
        .is_some_and(|list| list.iter().any(|f| f == finalizer))
}

/// True when the object has a deletion timestamp.
pub fn is_deleting(meta: &ObjectMeta) -> bool {
    meta.deletion_timestamp.is_some()
}

/// The finalizer list with `finalizer` appended, or `None` when it is already there.
pub fn finalizers_with(meta: &ObjectMeta, finalizer: &str) -> Option<Vec<String>> {
    if has_finalizer(meta, finalizer) {
        return None;
    }
    let mut list = meta.finalizers.clone().unwrap_or_default();
    list.push(finalizer.to_owned());
    Some(list)
}

/// The finalizer list without `finalizer`, or `None` when it is not there.
pub fn finalizers_without(meta: &ObjectMeta, finalizer: &str) -> Option<Vec<String>> {
    if !has_finalizer(meta, finalizer) {
        return None;
    }
    Some(
        meta.finalizers
            .iter()
            .flatten()
            .filter(|f| *f != finalizer)
            .cloned()
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(finalizers: &[&str]) -> ObjectMeta {
        ObjectMeta {
            finalizers: Some(finalizers.iter().map(|s| (*s).to_owned()).collect()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn adding_keeps_foreign_finalizers_and_is_idempotent() {
        let m = meta(&["other"]);
        assert_eq!(
            finalizers_with(&m, "mine"),
            Some(vec!["other".to_owned(), "mine".to_owned()])
        );
        assert_eq!(finalizers_with(&meta(&["other", "mine"]), "mine"), None);
        assert_eq!(
            finalizers_with(&ObjectMeta::default(), "mine"),
            Some(vec!["mine".to_owned()])
        );
    }

    #[test]
    fn removing_keeps_foreign_finalizers_and_is_idempotent() {
        assert_eq!(
            finalizers_without(&meta(&["a", "mine", "b"]), "mine"),
            Some(vec!["a".into(), "b".into()])
        );
        assert_eq!(finalizers_without(&meta(&["a"]), "mine"), None);
        assert_eq!(finalizers_without(&ObjectMeta::default(), "mine"), None);
    }
}
