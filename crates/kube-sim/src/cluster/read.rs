//! Reads: an object in the version the client asked for, and lists with selectors and paging.

use super::*;

impl Cluster {
    /// Renders a stored object in the requested version.
    pub fn present(info: &ResourceInfo, obj: &Arc<Value>) -> Arc<Value> {
        if !convert::needs_conversion(info, obj) {
            return obj.clone();
        }
        Arc::new(convert::from_storage(info, obj))
    }

    /// `present` of an object the caller owns (converted only when it must be).
    pub fn present_owned(info: &ResourceInfo, obj: Value) -> Value {
        if !convert::needs_conversion(info, &obj) {
            return obj;
        }
        convert::from_storage(info, &obj)
    }

    /// The JSON of a stored object in the requested version: its stored bytes unless it must be
    /// converted.
    pub fn present_json(info: &ResourceInfo, obj: &Stored) -> Stored {
        match obj.api_version() {
            Some(av) if info.is_api_version(&av) => obj.clone(),
            _ => Stored::encode(&convert::from_storage(info, &obj.value())),
        }
    }

    pub fn get(&self, info: &ResourceInfo, ns: &str, name: &str) -> Result<Arc<Value>> {
        self.store
            .get(&info.storage_key(), &Self::obj_key_for(info, ns, name))
            .map(|o| Self::present(info, &o))
            .ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))
    }

    pub fn list(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Result<ListResult> {
        let key = info.storage_key();
        let ns = ns.filter(|n| !n.is_empty() && info.namespaced);
        // A continue token carries the first page's resourceVersion: later pages are read at it.
        let (rv, after) = match &opts.continue_token {
            Some(token) => {
                let (rv, after) = decode_continue(token)?;
                (rv, Some(after))
            }
            None => (
                opts.resource_version_exact
                    .unwrap_or(self.store.resource_version()),
                None,
            ),
        };
        let snapshot = match self.store.list_at(&key, ns, rv) {
            Ok(s) => s,
            Err(_) if opts.continue_token.is_some() => {
                return Err(ApiError::gone(CONTINUE_EXPIRED));
            }
            Err(oldest) => {
                return Err(ApiError::gone(format!(
                    "too old resource version: {rv} ({})",
                    oldest.saturating_sub(1)
                )));
            }
        };
        let mut items = vec![];
        let mut next = None;
        let mut remaining = 0usize;
        let exact_name = opts.fields.exact_name();
        let selects = !opts.labels.is_empty() || !opts.fields.is_empty();
        let mut last_key: Option<&ObjName> = None;
        for (k, obj) in &snapshot {
            if let Some(a) = &after
                && (k.namespace(), k.name()) <= (a.0.as_str(), a.1.as_str())
            {
                continue;
            }
            if exact_name.is_some_and(|n| n != k.name()) {
                continue;
            }
            if selects && !crate::selectors::selects_stored(&opts.labels, &opts.fields, obj) {
                continue;
            }
            if let Some(limit) = opts.limit
                && items.len() >= limit
            {
                if next.is_none()
                    && let Some(last) = last_key
                {
                    next = Some(encode_continue(rv, last.namespace(), last.name()));
                }
                // As kube-apiserver: `remainingItemCount` only without selectors, so a
                // selected page need not read (and match) every object after it.
                if selects {
                    break;
                }
                remaining += 1;
                continue;
            }
            last_key = Some(k);
            items.push(Self::present_json(info, obj));
        }
        Ok(ListResult {
            items,
            resource_version: rv,
            remaining: next.as_ref().filter(|_| !selects).map(|_| remaining),
            continue_token: next,
        })
    }
}

/// kube-apiserver's answer to a continue token whose resourceVersion left the history.
const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// A continue token as kube-apiserver writes it: unpadded URL-safe base64 of
/// `{"v":"meta.k8s.io/v1","rv":N,"start":"<key>\u0000"}`, the start key being the last key
/// served (`namespace/name`) and the NUL meaning "after it".
pub fn encode_continue(rv: u64, namespace: &str, name: &str) -> String {
    use base64::Engine;
    let json =
        json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{namespace}/{name}\u{0}")});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json.to_string())
}

/// The resourceVersion and last key of a continue token, with kube-apiserver's messages.
pub fn decode_continue(token: &str) -> Result<(u64, ObjKey)> {
    use base64::Engine;
    let invalid = |why: String| ApiError::bad_request(format!("continue key is not valid: {why}"));
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|e| match e {
            base64::DecodeError::InvalidByte(at, _) => {
                invalid(format!("illegal base64 data at input byte {at}"))
            }
            other => invalid(other.to_string()),
        })?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    if v["v"] != "meta.k8s.io/v1" {
        return Err(invalid(
            "server does not recognize this encoded version".into(),
        ));
    }
    let rv = v["rv"].as_u64().filter(|rv| *rv > 0).ok_or_else(|| {
        invalid("incorrect encoded start resourceVersion (version meta.k8s.io/v1)".into())
    })?;
    let start = v["start"].as_str().unwrap_or_default();
    let start = start.strip_suffix('\u{0}').unwrap_or(start);
    let Some((namespace, name)) = start.split_once('/').filter(|(_, n)| !n.is_empty()) else {
        return Err(invalid("encoded start key empty".into()));
    };
    Ok((rv, (namespace.to_string(), name.to_string())))
}
