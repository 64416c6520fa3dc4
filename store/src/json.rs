//! Typed values at the store's door. Every record KAT keeps is JSON; it is encoded and decoded
//! here, once, and an error names the key. A value that cannot be encoded is an error, never an
//! empty write; one that cannot be decoded is an error, never a default.

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{KeyValue, LeaseId, Result, Revision, StateStore, StoreError, TxnOp};

/// `value` as the bytes stored at `key`.
pub fn encode<T: Serialize + ?Sized>(key: &str, value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| StoreError::Value {
        key: key.to_string(),
        detail: format!("cannot be encoded: {e}"),
    })
}

/// The value stored in `kv`, as a `T`.
pub fn decode<T: DeserializeOwned>(kv: &KeyValue) -> Result<T> {
    decode_value(&kv.key, &kv.value)
}

/// `value`, stored at `key` (a watch event's, say), as a `T`. Every record KAT reads from
/// the store is decoded here or by [`decode`]: an error names the key.
// The one place a stored record is decoded (clippy.toml refuses the call elsewhere).
#[allow(clippy::disallowed_methods)]
pub fn decode_value<T: DeserializeOwned>(key: &str, value: &[u8]) -> Result<T> {
    serde_json::from_slice(value).map_err(|e| StoreError::Value {
        key: key.to_string(),
        detail: format!("holds a value KAT cannot read: {e}"),
    })
}

/// The value in `kv` as a `T`, or `None` with a warning that names the key: for listings,
/// where one record KAT cannot read must hide nothing else, and must not pass in silence.
pub fn decode_or_skip<T: DeserializeOwned>(kv: &KeyValue) -> Option<T> {
    skip_unreadable(decode(kv))
}

/// [`decode_value`], or `None` with a warning that names the key.
pub fn decode_value_or_skip<T: DeserializeOwned>(key: &str, value: &[u8]) -> Option<T> {
    skip_unreadable(decode_value(key, value))
}

fn skip_unreadable<T>(decoded: Result<T>) -> Option<T> {
    decoded
        .inspect_err(|e| tracing::warn!(error = %e, "skipping a record KAT cannot read"))
        .ok()
}

impl TxnOp {
    /// A put of `value`, encoded as JSON.
    pub fn put_json<T: Serialize + ?Sized>(key: impl Into<String>, value: &T) -> Result<TxnOp> {
        let key = key.into();
        let value = encode(&key, value)?;
        Ok(TxnOp::put(key, value))
    }
}

/// JSON reads and writes on any [`StateStore`] (`dyn` included).
#[async_trait]
pub trait JsonStore {
    /// The value at `key`, decoded, with its metadata; `None` if there is none.
    async fn get_json<T: DeserializeOwned>(&self, key: &str) -> Result<Option<(T, KeyValue)>>;

    /// Store `value` at `key`, encoded. Returns the new revision.
    async fn put_json<T: Serialize + Sync + ?Sized>(
        &self,
        key: &str,
        value: &T,
        lease: Option<LeaseId>,
    ) -> Result<Revision>;
}

#[async_trait]
impl<S: StateStore + ?Sized> JsonStore for S {
    async fn get_json<T: DeserializeOwned>(&self, key: &str) -> Result<Option<(T, KeyValue)>> {
        match self.get(key).await? {
            Some(kv) => Ok(Some((decode(&kv)?, kv))),
            None => Ok(None),
        }
    }

    async fn put_json<T: Serialize + Sync + ?Sized>(
        &self,
        key: &str,
        value: &T,
        lease: Option<LeaseId>,
    ) -> Result<Revision> {
        let bytes = encode(key, value)?;
        self.put(key, bytes, lease).await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::MemStore;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Record {
        name: String,
        replicas: u32,
    }

    #[tokio::test]
    async fn a_value_goes_in_and_comes_back_typed() {
        let store = MemStore::new();
        let r = Record {
            name: "web".into(),
            replicas: 3,
        };
        store.put_json("/a", &r, None).await.unwrap();
        let (back, kv) = store.get_json::<Record>("/a").await.unwrap().unwrap();
        assert_eq!(back, r);
        assert_eq!(kv.version, 1);
        assert!(store.get_json::<Record>("/none").await.unwrap().is_none());
    }

    /// A value that cannot be read is an error naming the key, not a default.
    #[tokio::test]
    async fn an_unreadable_value_names_its_key() {
        let store = MemStore::new();
        store
            .put("/bad", b"{\"name\":1}".to_vec(), None)
            .await
            .unwrap();
        let err = store.get_json::<Record>("/bad").await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Value { key, .. } if key == "/bad"),
            "{err}"
        );
        assert!(err.to_string().contains("/bad"), "{err}");
    }

    /// A value serde refuses to encode (a map with non-string keys) is an error, and nothing
    /// is written: the old value stays.
    #[tokio::test]
    async fn a_value_that_cannot_be_encoded_writes_nothing() {
        let store = MemStore::new();
        store.put("/k", b"\"old\"".to_vec(), None).await.unwrap();
        let mut bad: BTreeMap<(u8, u8), u8> = BTreeMap::new();
        bad.insert((1, 2), 3);
        let err = store.put_json("/k", &bad, None).await.unwrap_err();
        assert!(err.to_string().contains("/k"), "{err}");
        assert!(TxnOp::put_json("/k", &bad).is_err());
        assert_eq!(store.get("/k").await.unwrap().unwrap().value, b"\"old\"");
    }

    /// One record KAT cannot read in a listing hides none of the others.
    #[tokio::test]
    async fn a_bad_record_in_a_listing_is_skipped_alone() {
        let store = MemStore::new();
        for (k, v) in [
            ("/l/a", "{\"name\":\"a\",\"replicas\":1}"),
            ("/l/b", "not json"),
            ("/l/c", "{\"name\":\"c\",\"replicas\":3}"),
        ] {
            store.put(k, v.as_bytes().to_vec(), None).await.unwrap();
        }
        let listing = store.list("/l/").await.unwrap();
        let read: Vec<Record> = listing.kvs.iter().filter_map(decode_or_skip).collect();
        let names: Vec<&str> = read.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "c"]);
    }
}
