//! Authentication (opt-in): bearer tokens mapped to users and groups, from a kube-apiserver
//! `--token-auth-file` CSV (`token,user,uid,"group1,group2"`), from the library, or ServiceAccount
//! tokens minted by [`crate::KubeSim::service_account_token`] (valid while the ServiceAccount
//! exists). The generated kubeconfig carries an admin token in `system:masters`.

use crate::error::ApiError;
use crate::rbac::UserInfo;
use crate::store::Store;
use std::collections::HashMap;
use std::path::PathBuf;

/// Authentication and authorization settings; the default turns both off (everyone is admin).
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    /// A static token CSV file, as kube-apiserver's `--token-auth-file`.
    pub token_file: Option<PathBuf>,
    /// Tokens given directly.
    pub static_tokens: Vec<StaticToken>,
    /// Authorize with RBAC (else every authenticated request is allowed).
    pub rbac: bool,
    /// Requests without credentials are `system:anonymous` instead of the admin. Off by default,
    /// as on kube-apiserver's old insecure port: kubectl (client-go) never sends a bearer token
    /// over plain HTTP, so it acts as the admin and tests a user with `--as`/`--as-group`
    /// (impersonation), while kube-rs clients do send tokens.
    pub anonymous_requests: bool,
}

impl AuthConfig {
    pub fn enabled(&self) -> bool {
        self.rbac || self.token_file.is_some() || !self.static_tokens.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticToken {
    pub token: String,
    pub user: UserInfo,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("cannot read the token file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("token file line {line}: {why}")]
    Parse { line: usize, why: String },
}

/// Splits one CSV record (double quotes group commas; `""` is a quote).
fn csv_fields(line: &str) -> Result<Vec<String>, String> {
    let mut fields = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                if let Some(f) = fields.last_mut() {
                    f.push('"');
                }
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(String::new()),
            (c, _) => {
                if let Some(f) = fields.last_mut() {
                    f.push(c);
                }
            }
        }
    }
    if quoted {
        return Err("unterminated quote".into());
    }
    Ok(fields)
}

/// Parses a token CSV: `token,user,uid[,"group1,group2"]` per line.
pub fn parse_token_csv(text: &str) -> Result<Vec<StaticToken>, AuthError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f = csv_fields(line).map_err(|why| AuthError::Parse { line: i + 1, why })?;
        if f.len() < 3 || f[0].is_empty() || f[1].is_empty() {
            return Err(AuthError::Parse {
                line: i + 1,
                why: "expected token,user,uid[,\"groups\"]".into(),
            });
        }
        let mut groups: Vec<String> = f
            .get(3)
            .map(|g| {
                g.split(',')
                    .map(str::trim)
                    .filter(|g| !g.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        groups.push("system:authenticated".into());
        out.push(StaticToken {
            token: f[0].clone(),
            user: UserInfo {
                name: f[1].clone(),
                uid: f[2].clone(),
                groups,
            },
        });
    }
    Ok(out)
}

fn signature(secret: u64, namespace: &str, name: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ secret;
    for b in namespace.bytes().chain([0u8]).chain(name.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

pub const ADMIN_USER: &str = "kube-sim-admin";

/// The identity of the generated kubeconfig.
pub fn admin() -> UserInfo {
    UserInfo::new(ADMIN_USER, &["system:masters", "system:authenticated"])
}

/// The identity a request impersonates (`Impersonate-User`, `Impersonate-Group` headers), as
/// kube-apiserver builds it: ServiceAccount users get their groups, everyone `system:authenticated`.
pub fn impersonated(user: &str, groups: &[&str]) -> UserInfo {
    let mut u = match user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
    {
        Some((ns, name)) => UserInfo::service_account(ns, name),
        None => UserInfo::new(user, &[]),
    };
    for g in groups {
        if !u.groups.iter().any(|x| x == g) {
            u.groups.push(g.to_string());
        }
    }
    if !u.groups.iter().any(|g| g == "system:authenticated") {
        u.groups.push("system:authenticated".into());
    }
    u
}

/// Maps bearer tokens to identities.
#[derive(Debug)]
pub struct Authenticator {
    enabled: bool,
    pub rbac: bool,
    pub anonymous_requests: bool,
    tokens: HashMap<String, UserInfo>,
    admin_token: String,
    secret: u64,
}

impl Authenticator {
    pub fn new(config: &AuthConfig) -> Result<Self, AuthError> {
        let random = crate::util::Random::default();
        let admin_token = format!("admin-{}", random.uuid());
        let mut tokens: HashMap<String, UserInfo> = HashMap::new();
        if let Some(path) = &config.token_file {
            let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
                path: path.clone(),
                source,
            })?;
            for t in parse_token_csv(&text)? {
                tokens.insert(t.token, t.user);
            }
        }
        for t in &config.static_tokens {
            let mut user = t.user.clone();
            if !user.groups.iter().any(|g| g == "system:authenticated") {
                user.groups.push("system:authenticated".into());
            }
            tokens.insert(t.token.clone(), user);
        }
        tokens.insert(admin_token.clone(), admin());
        Ok(Self {
            enabled: config.enabled(),
            rbac: config.rbac,
            anonymous_requests: config.anonymous_requests,
            tokens,
            admin_token,
            secret: random.next_u64(),
        })
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The token of the generated kubeconfig, when authentication is on.
    pub fn admin_token(&self) -> Option<&str> {
        self.enabled.then_some(self.admin_token.as_str())
    }

    /// A token that authenticates as the ServiceAccount (while it exists).
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        format!(
            "ksa.{namespace}.{name}.{}",
            signature(self.secret, namespace, name)
        )
    }

    /// The identity behind an `Authorization` header value; `Err` is a 401.
    pub fn authenticate(
        &self,
        authorization: Option<&str>,
        store: &Store,
    ) -> Result<UserInfo, ApiError> {
        let unauthorized = || ApiError::new(401, "Unauthorized", "Unauthorized");
        let Some(header) = authorization else {
            return Ok(if self.anonymous_requests {
                UserInfo::anonymous()
            } else {
                admin()
            });
        };
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .map(str::trim)
            .ok_or_else(unauthorized)?;
        if let Some(user) = self.tokens.get(token) {
            return Ok(user.clone());
        }
        let rest = token.strip_prefix("ksa.").ok_or_else(unauthorized)?;
        let (namespace, rest) = rest.split_once('.').ok_or_else(unauthorized)?;
        let (name, sig) = rest.rsplit_once('.').ok_or_else(unauthorized)?;
        if sig != signature(self.secret, namespace, name) {
            return Err(unauthorized());
        }
        let sa_key = (String::new(), "serviceaccounts".to_string());
        if store
            .get(&sa_key, &(namespace.to_string(), name.to_string()))
            .is_none()
        {
            return Err(unauthorized());
        }
        Ok(UserInfo::service_account(namespace, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn token_csv_like_kube_apiserver() {
        let tokens = parse_token_csv(
            "# comment\nt1,alice,1001,\"dev,ops\"\nt2,bob,1002\n\nt3,\"carol, c\",1003,single\n",
        )
        .expect("valid");
        assert_eq!(tokens.len(), 3);
        assert_eq!(tokens[0].user.name, "alice");
        assert_eq!(
            tokens[0].user.groups,
            ["dev", "ops", "system:authenticated"]
        );
        assert_eq!(tokens[1].user.groups, ["system:authenticated"]);
        assert_eq!(tokens[2].user.name, "carol, c");
        assert!(parse_token_csv("onlytoken\n").is_err());
        assert!(parse_token_csv("t,\"open,1\n").is_err());
    }

    #[test]
    fn tokens_map_to_identities() {
        let auth = Authenticator::new(&AuthConfig {
            static_tokens: vec![StaticToken {
                token: "secret".into(),
                user: UserInfo::new("alice", &["dev"]),
            }],
            ..Default::default()
        })
        .expect("auth");
        let mut store = Store::new(10);
        store.put(
            &(String::new(), "serviceaccounts".into()),
            json!({"metadata": {"namespace": "team", "name": "bot.v1"}}),
        );
        let alice = auth
            .authenticate(Some("Bearer secret"), &store)
            .expect("known");
        assert_eq!(alice.groups, ["dev", "system:authenticated"]);
        let admin = auth
            .authenticate(
                Some(&format!("Bearer {}", auth.admin_token().expect("on"))),
                &store,
            )
            .expect("admin");
        assert!(admin.groups.contains(&"system:masters".to_string()));
        let sa_token = auth.service_account_token("team", "bot.v1");
        let sa = auth
            .authenticate(Some(&format!("Bearer {sa_token}")), &store)
            .expect("sa");
        assert_eq!(sa.name, "system:serviceaccount:team:bot.v1");
        assert!(
            sa.groups
                .contains(&"system:serviceaccounts:team".to_string())
        );
        let forged = sa_token.replace("team", "kube-system");
        assert_eq!(
            auth.authenticate(Some(&format!("Bearer {forged}")), &store)
                .map_err(|e| e.code),
            Err(401)
        );
        let missing = auth.service_account_token("team", "gone");
        assert!(
            auth.authenticate(Some(&format!("Bearer {missing}")), &store)
                .is_err()
        );
        assert_eq!(
            auth.authenticate(None, &store)
                .expect("no credentials")
                .name,
            ADMIN_USER,
            "the insecure-port default"
        );
        let strict = Authenticator::new(&AuthConfig {
            rbac: true,
            anonymous_requests: true,
            ..Default::default()
        })
        .expect("auth");
        assert_eq!(
            strict.authenticate(None, &store).expect("anonymous").name,
            "system:anonymous"
        );
        let sa = impersonated("system:serviceaccount:team:bot", &["extra"]);
        assert_eq!(
            sa.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:team",
                "system:authenticated",
                "extra"
            ]
        );
        assert_eq!(impersonated("bob", &[]).groups, ["system:authenticated"]);
        assert!(auth.authenticate(Some("Basic abc"), &store).is_err());
    }
}
