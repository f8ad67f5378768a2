//! String enums that keep strings they do not know.
//!
//! Every string enum of the referenced Go APIs is a `type X string`: Go decodes any string into
//! it, so an object written by a newer or foreign controller never fails to decode. The enums
//! here follow that: known strings map to variants, anything else lands in `Other(String)` and
//! is written back verbatim, so a read-modify-write never changes a value it did not mean to.
//! Their CRD schema is a plain `type: string`, as in the reference CRDs.

/// Declares a string enum with an `Other(String)` fallback (see the module docs).
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $wire:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A string this version does not know, kept verbatim.
            Other(String),
        }

        impl $name {
            /// Every known variant, in declaration order.
            pub const KNOWN: &'static [$name] = &[$($name::$variant),+];

            /// The exact wire string.
            pub fn as_str(&self) -> &str {
                match self {
                    $( $name::$variant => $wire, )+
                    $name::Other(s) => s.as_str(),
                }
            }

            /// True for a variant this version knows (not `Other`).
            pub fn is_known(&self) -> bool {
                !matches!(self, $name::Other(_))
            }
        }

        impl ::std::convert::From<&str> for $name {
            fn from(s: &str) -> Self {
                match s {
                    $( $wire => $name::$variant, )+
                    other => $name::Other(other.to_owned()),
                }
            }
        }

        impl ::std::convert::From<String> for $name {
            fn from(s: String) -> Self {
                match $name::from(s.as_str()) {
                    $name::Other(_) => $name::Other(s),
                    known => known,
                }
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = ::std::convert::Infallible;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Ok($name::from(s))
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let s = <String as ::serde::Deserialize>::deserialize(deserializer)?;
                Ok($name::from(s))
            }
        }

        impl ::schemars::JsonSchema for $name {
            fn schema_name() -> ::std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut ::schemars::SchemaGenerator) -> ::schemars::Schema {
                ::schemars::json_schema!({ "type": "string" })
            }
        }
    };
}

pub(crate) use wire_enum;

/// Schema of a free-form JSON object whose content the API server must keep as is.
pub(crate) fn preserve_unknown_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

#[cfg(test)]
mod tests {
    wire_enum! {
        /// Test enum.
        pub enum Colour {
            Red => "red",
            DarkBlue => "dark-blue",
        }
    }

    #[test]
    fn known_strings_map_to_variants_and_back() {
        for c in Colour::KNOWN {
            assert_eq!(&Colour::from(c.as_str()), c);
            assert!(c.is_known());
        }
        assert_eq!(Colour::from("dark-blue"), Colour::DarkBlue);
        assert_eq!(Colour::DarkBlue.to_string(), "dark-blue");
    }

    #[test]
    fn unknown_strings_are_kept_verbatim() {
        let c: Colour = serde_json::from_str("\"Red\"").expect("any string decodes");
        assert_eq!(c, Colour::Other("Red".into()));
        assert!(!c.is_known());
        assert_eq!(serde_json::to_string(&c).expect("serialises"), "\"Red\"");
    }

    #[test]
    fn non_strings_are_rejected() {
        assert!(serde_json::from_str::<Colour>("1").is_err());
    }
}
