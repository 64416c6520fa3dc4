//! The OpenAPI schemas of the few wire types that are not plain derives (with the `openapi`
//! feature): times and checked names travel as strings. The document itself is the API
//! server's (`kat_apiserver::openapi`).

use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::{RefOr, Schema};

use crate::timestamp::Timestamp;
use crate::typed_names::{InstanceId, NodeName};

fn string(description: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(description))
}

impl utoipa::PartialSchema for Timestamp {
    fn schema() -> RefOr<Schema> {
        string("A time in UTC, RFC 3339 with milliseconds")
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
            .into()
    }
}
impl utoipa::ToSchema for Timestamp {}

impl utoipa::PartialSchema for InstanceId {
    fn schema() -> RefOr<Schema> {
        string("An instance id: `{workload}-{8 hex digits}`")
            .pattern(Some("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))
            .into()
    }
}
impl utoipa::ToSchema for InstanceId {}

impl utoipa::PartialSchema for NodeName {
    fn schema() -> RefOr<Schema> {
        string("A node's name")
            .pattern(Some("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))
            .into()
    }
}
impl utoipa::ToSchema for NodeName {}
