//! Questions every controller asks of a failed API call: was it a conflict (a stale cache, retry
//! soon), a 404, a 403? Asked of a `kube::Error` or of any error whose source chain holds one.

/// The `kube::Error` in `error`'s source chain (itself included), if any.
pub fn find_kube_error<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a kube::Error> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(kube) = error.downcast_ref::<kube::Error>() {
            return Some(kube);
        }
        current = error.source();
    }
    None
}

/// The HTTP status code of an API error response.
pub fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// A 409: a guarded write lost a race, or a create found the name taken (the cache was stale).
pub fn is_conflict(error: &kube::Error) -> bool {
    status_code(error) == Some(409)
}

/// A JSON patch whose `test` op failed: the object is no longer what the cache showed. Since
/// kubernetes/kubernetes#68838 kube-apiserver answers a patch that does not apply with its generic
/// 422 (reason `Invalid`), whose one cause is the patch library's message and names no field; a
/// 422 from validation names the offending fields instead, and is not a stale cache.
pub fn is_failed_patch_test(error: &kube::Error) -> bool {
    let kube::Error::Api(status) = error else {
        return false;
    };
    let causes = status.details.as_ref().map(|d| d.causes.as_slice());
    status.code == 422
        && causes.is_some_and(|causes| {
            !causes.is_empty()
                && causes
                    .iter()
                    .all(|c| c.reason == "UnexpectedServerResponse" && c.field.is_empty())
        })
}

/// A 404 from the API server.
pub fn is_not_found(error: &kube::Error) -> bool {
    status_code(error) == Some(404)
}

/// A 403: the ServiceAccount lacks a permission (the API request span logs which one).
pub fn is_forbidden(error: &kube::Error) -> bool {
    status_code(error) == Some(403)
}

/// A failure that may pass by itself: the server overloaded or failing (429, 5xx), or no answer
/// at all (a connection or timeout error). A 4xx refusal is not: sending the same request
/// again gets the same answer.
pub fn is_transient(error: &kube::Error) -> bool {
    match status_code(error) {
        Some(code) => code == 429 || code >= 500,
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("message", reason)
                .with_code(code)
                .boxed(),
        )
    }

    #[derive(Debug, thiserror::Error)]
    #[error("patching status of {machine}")]
    struct PatchStatus {
        machine: String,
        #[source]
        source: kube::Error,
    }

    #[test]
    fn classifies_status_codes() {
        assert!(is_conflict(&api(409, "Conflict")));
        assert!(is_conflict(&api(409, "AlreadyExists")));
        assert!(!is_conflict(&api(422, "Invalid")));
        assert!(is_not_found(&api(404, "NotFound")));
        assert!(is_forbidden(&api(403, "Forbidden")));
        assert!(!is_forbidden(&api(401, "Unauthorized")));
        assert!(is_transient(&api(500, "InternalError")));
        assert!(is_transient(&api(429, "TooManyRequests")));
        assert!(is_transient(&api(503, "ServiceUnavailable")));
        assert!(!is_transient(&api(403, "Forbidden")));
        assert!(!is_transient(&api(422, "Invalid")));
        assert!(is_transient(&kube::Error::LinesCodecMaxLineLengthExceeded));
    }

    /// A 422 as it comes over the wire, with one cause.
    fn unapplied_patch(cause_reason: &str, field: &str) -> kube::Error {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 422,
            "reason": "Invalid",
            "message": "the server rejected our request due to an error in our request",
            "details": {"causes": [{
                "reason": cause_reason,
                "message": "testing value /metadata/finalizers failed: test failed",
                "field": field,
            }]},
        }))
        .expect("a Status");
        kube::Error::Api(status.boxed())
    }

    #[test]
    fn a_failed_patch_test_is_told_from_a_validation_error() {
        assert!(is_failed_patch_test(&unapplied_patch(
            "UnexpectedServerResponse",
            ""
        )));
        assert!(!is_failed_patch_test(&unapplied_patch(
            "FieldValueInvalid",
            "metadata.labels"
        )));
        assert!(
            !is_failed_patch_test(&api(422, "Invalid")),
            "no causes: not known to be a patch test"
        );
        assert!(!is_failed_patch_test(&api(409, "Conflict")));
    }

    #[test]
    fn finds_the_kube_error_behind_a_wrapping_error() {
        let wrapped = PatchStatus {
            machine: "m-1".into(),
            source: api(409, "Conflict"),
        };
        let found = find_kube_error(&wrapped).expect("in the source chain");
        assert!(is_conflict(found));
        let plain = std::io::Error::other("no kube error here");
        assert!(find_kube_error(&plain).is_none());
    }
}
