"""The console API's own check for schemathesis: every error is a problem
document (RFC 9457) whose status is the answer's."""

import json

import schemathesis


@schemathesis.check
def problem_body(ctx, response, case):
    if response.status_code < 400:
        return None
    media = response.headers.get("content-type", [""])
    media = media[0] if isinstance(media, list) else media
    if not media.startswith("application/problem+json"):
        raise AssertionError(
            f"{response.status_code} answered as {media!r}, not application/problem+json"
        )
    body = json.loads(response.content)
    if body.get("status") != response.status_code:
        raise AssertionError(f"problem status {body.get('status')!r} is not {response.status_code}")
    if not body.get("detail"):
        raise AssertionError("the problem says nothing in its detail")
    return None
