//! The two tools every user of the spend core adds beside its own: `operation_status` and
//! `resume_operation`. Their names and input schemas are written here once; the router and the
//! gateway list them as they are. Neither spends, neither takes an identity field.

use rmcp::model::Tool;
use serde_json::json;

/// Status of an operation by handle.
pub const OPERATION_STATUS: &str = "operation_status";
/// Runs an approved operation.
pub const RESUME_OPERATION: &str = "resume_operation";

/// `operation_status` and `resume_operation`, with their input schemas.
pub fn operation_tools() -> [Tool; 2] {
    let handle = json!({
        "type": "object",
        "properties": {"handle": {
            "type": "string",
            "description": "The public operation handle (`hubu:public-operation:v1:...`) a spend returned."
        }},
        "required": ["handle"],
        "additionalProperties": false
    });
    [
        Tool::new(
            OPERATION_STATUS,
            "The state of an operation by public handle (pending, awaiting_approval, completed, \
             denied, failed) and its recorded result. Spends nothing.",
            rmcp::model::object(handle.clone()),
        ),
        Tool::new(
            RESUME_OPERATION,
            "Run an operation a person approved, by public handle: it runs the original request \
             exactly once; later calls return its recorded result.",
            rmcp::model::object(handle),
        ),
    ]
}
