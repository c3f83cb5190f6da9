//! The table, found or made when the store opens: created when missing
//! (on-demand capacity, one string partition key `pk`, time to live on the
//! `ttl` attribute), or checked when it exists, with an explanation when its
//! key shape is not the one this store writes.

use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
    TimeToLiveSpecification, TimeToLiveStatus,
};
use idem_core::{Error, ErrorKind, StoreError};

use crate::error::map_error;
use crate::item::{PARTITION_KEY, TTL_ATTRIBUTE};

/// How long a new table may take to become active.
const ACTIVE_WITHIN: Duration = Duration::from_secs(60);

/// Finds `table` (creating it when missing and `create` allows), checks its
/// key shape and turns its time to live on.
pub(crate) async fn open(
    client: &Client,
    table: &str,
    shown: &str,
    create: bool,
) -> Result<(), Error> {
    let described = client.describe_table().table_name(table).send().await;
    let description = match described {
        Ok(found) => found.table,
        Err(error) if error.code() == Some("ResourceNotFoundException") => {
            if !create {
                return Err(config(format!(
                    "{shown}: table {table:?} does not exist, and this store was opened without creating tables; create it with one string partition key named {PARTITION_KEY:?}, or open the store with table creation on"
                )));
            }
            create_table(client, table, shown).await?;
            None
        }
        Err(error) => {
            return Err(map_error(
                &format!("describing table {table:?} at {shown}"),
                false,
                error,
            ));
        }
    };
    let description = match description {
        Some(description) if description.table_status() != Some(&TableStatus::Creating) => {
            description
        }
        _ => wait_until_active(client, table, shown).await?,
    };
    check_shape(&description, table, shown)?;
    enable_ttl(client, table, shown).await
}

async fn create_table(client: &Client, table: &str, shown: &str) -> Result<(), Error> {
    let definition = AttributeDefinition::builder()
        .attribute_name(PARTITION_KEY)
        .attribute_type(ScalarAttributeType::S)
        .build()
        .map_err(|e| config(format!("the table's definition: {e}")))?;
    let key = KeySchemaElement::builder()
        .attribute_name(PARTITION_KEY)
        .key_type(KeyType::Hash)
        .build()
        .map_err(|e| config(format!("the table's key: {e}")))?;
    let created = client
        .create_table()
        .table_name(table)
        .attribute_definitions(definition)
        .key_schema(key)
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await;
    match created {
        Ok(_) => {
            tracing::info!(table, at = shown, "created the DynamoDB table (on-demand)");
            Ok(())
        }
        // Another process created it first: it is checked like any other.
        Err(error) if error.code() == Some("ResourceInUseException") => Ok(()),
        Err(error) => Err(map_error(
            &format!("creating table {table:?} at {shown}"),
            true,
            error,
        )),
    }
}

async fn wait_until_active(
    client: &Client,
    table: &str,
    shown: &str,
) -> Result<aws_sdk_dynamodb::types::TableDescription, Error> {
    let deadline = tokio::time::Instant::now() + ACTIVE_WITHIN;
    loop {
        let found = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| map_error(&format!("describing table {table:?} at {shown}"), false, e))?;
        if let Some(description) = found.table
            && description.table_status() != Some(&TableStatus::Creating)
        {
            return Ok(description);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(StoreError::new(
                ErrorKind::Unavailable,
                format!(
                    "{shown}: table {table:?} was still being created after {} s; open the store again shortly",
                    ACTIVE_WITHIN.as_secs()
                ),
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Refuses a table whose key is not one string partition key named `pk`.
fn check_shape(
    description: &aws_sdk_dynamodb::types::TableDescription,
    table: &str,
    shown: &str,
) -> Result<(), Error> {
    let keys: Vec<String> = description
        .key_schema()
        .iter()
        .map(|k| format!("{} ({})", k.attribute_name(), k.key_type().as_str()))
        .collect();
    let hash_is_pk = matches!(
        description.key_schema(),
        [only] if only.attribute_name() == PARTITION_KEY && only.key_type() == &KeyType::Hash
    );
    let pk_is_text = description.attribute_definitions().iter().any(|d| {
        d.attribute_name() == PARTITION_KEY && d.attribute_type() == &ScalarAttributeType::S
    });
    if hash_is_pk && pk_is_text {
        return Ok(());
    }
    Err(config(format!(
        "{shown}: table {table:?} exists with the key {}, but Idem keeps its items under one string partition key named {PARTITION_KEY:?} and no sort key; give the store a table of its own (another name in the URL), and Idem creates it",
        if keys.is_empty() {
            "(none)".to_owned()
        } else {
            keys.join(", ")
        }
    )))
}

/// Turns the table's time to live on, on the `ttl` attribute. Retention
/// does not depend on it (reads treat items past their window as absent,
/// and the sweeper deletes them), so a table whose time to live reads
/// another attribute, or credentials that may not change it, only earn a
/// warning.
async fn enable_ttl(client: &Client, table: &str, shown: &str) -> Result<(), Error> {
    let current = match client
        .describe_time_to_live()
        .table_name(table)
        .send()
        .await
    {
        Ok(current) => current,
        Err(error) => {
            let error = map_error(
                &format!("reading the time to live of table {table:?} at {shown}"),
                false,
                error,
            );
            tracing::warn!(%error, "DynamoDB will not delete old items by itself unless the table's time to live is on the ttl attribute; the sweeps still do");
            return Ok(());
        }
    };
    let description = current.time_to_live_description();
    let status = description.and_then(|d| d.time_to_live_status());
    let attribute = description.and_then(|d| d.attribute_name());
    match status {
        Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling) => {
            if attribute.is_some_and(|a| a != TTL_ATTRIBUTE) {
                tracing::warn!(
                    table,
                    attribute,
                    "the table's time to live reads another attribute than {TTL_ATTRIBUTE:?}: DynamoDB will not delete Idem's old items by itself, only the sweeps will"
                );
            }
        }
        _ => {
            let spec = TimeToLiveSpecification::builder()
                .enabled(true)
                .attribute_name(TTL_ATTRIBUTE)
                .build()
                .map_err(|e| config(format!("the time to live: {e}")))?;
            if let Err(error) = client
                .update_time_to_live()
                .table_name(table)
                .time_to_live_specification(spec)
                .send()
                .await
            {
                let error = map_error(
                    &format!("turning on the time to live of table {table:?} at {shown}"),
                    true,
                    error,
                );
                tracing::warn!(%error, "DynamoDB will not delete old items by itself until the table's time to live is on the ttl attribute; the sweeps still do");
            }
        }
    }
    Ok(())
}

fn config(message: String) -> Error {
    StoreError::new(ErrorKind::Config, message).into()
}
