//! Namespaces: the leader's namespace records, as the API offers them.

use kat_api::wire::NamespaceObject;
use kat_leader::desired::namespaces;

use super::{Result, Service};

impl Service {
    pub async fn namespaces(&self) -> Result<Vec<NamespaceObject>> {
        Ok(namespaces::list(&*self.store).await?)
    }

    pub async fn namespace(&self, name: &str) -> Result<NamespaceObject> {
        Ok(namespaces::get(&*self.store, name).await?)
    }

    pub async fn create_namespace(&self, name: &str) -> Result<NamespaceObject> {
        Ok(namespaces::create(&*self.store, &self.clock, name, false).await?)
    }

    pub async fn delete_namespace(&self, name: &str) -> Result<()> {
        Ok(namespaces::delete(&*self.store, name).await?)
    }
}
