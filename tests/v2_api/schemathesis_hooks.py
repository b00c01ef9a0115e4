"""Schemathesis hooks of tests/v2_api/tests/openapi.rs.

POST /v2/fs/upload-batch takes a tar stream as application/x-tar or
application/gzip, media types schemathesis has no serializer for: the
generated body is sent as raw bytes, as for application/octet-stream.
"""

import schemathesis

schemathesis.serializer.alias(
    ["application/x-tar", "application/gzip"], "application/octet-stream"
)
