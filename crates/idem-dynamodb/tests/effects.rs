//! Effects written with the store's SDK client in the tests: a counter item
//! per name in a table of the test's own, added to inside an atomic apply's
//! transaction and read back from DynamoDB.

#![allow(dead_code)]

use std::collections::HashMap;

use idem_dynamodb::aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType, Update,
};
use idem_dynamodb::{DynamoStore, Transaction};

/// Creates the table `table` with a string partition key `id`, for the
/// effects' counters (or to stand for a table of another shape).
pub(crate) async fn create_id_table(store: &DynamoStore, table: &str) {
    store
        .client()
        .create_table()
        .table_name(table)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("id")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("id")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .expect("create the effects' table");
}

/// The update that adds `amount` to counter `name` in `table`.
pub(crate) fn add(table: &str, name: &str, amount: i64) -> Update {
    Update::builder()
        .table_name(table)
        .key("id", AttributeValue::S(name.to_owned()))
        .update_expression("ADD n :amount")
        .expression_attribute_values(":amount", AttributeValue::N(amount.to_string()))
        .build()
        .expect("a complete update")
}

/// Adds `amount` to counter `name` in the effect's transaction.
pub(crate) fn add_in(tx: &mut Transaction, table: &str, name: &str, amount: i64) {
    tx.update(add(table, name, amount));
}

/// Item `name` of `table`, read consistently; `None` when it is absent.
async fn item(
    store: &DynamoStore,
    table: &str,
    name: &str,
) -> Option<HashMap<String, AttributeValue>> {
    store
        .client()
        .get_item()
        .table_name(table)
        .key("id", AttributeValue::S(name.to_owned()))
        .consistent_read(true)
        .send()
        .await
        .expect("read an item")
        .item
}

/// Counter `name`'s value in `table` (0 when it was never written).
pub(crate) async fn counter(store: &DynamoStore, table: &str, name: &str) -> i64 {
    match item(store, table, name)
        .await
        .and_then(|item| item.get("n").cloned())
    {
        Some(AttributeValue::N(n)) => n.parse().expect("a whole number"),
        _ => 0,
    }
}

/// Whether item `name` exists in `table`.
pub(crate) async fn exists(store: &DynamoStore, table: &str, name: &str) -> bool {
    item(store, table, name).await.is_some()
}
