"""moto's server, with DynamoDB's requests served one at a time.

moto serves each request on a thread of its own, and it checks a
conditional write's condition and makes the write as two steps: two
conditional writes of one item that arrive together can both pass, which
DynamoDB never allows. Serving DynamoDB's requests one at a time gives its
conditional writes and transactions the atomicity DynamoDB has; the other
services (SQS's long polls among them) keep a thread each.

Run as moto_server is: python moto_server.py -H 127.0.0.1 -p 5000
"""

import sys
import threading

from moto import server
from moto.dynamodb.responses import DynamoHandler

_one_at_a_time = threading.Lock()
_call_action = DynamoHandler.call_action


def _serial_call_action(self):
    with _one_at_a_time:
        return _call_action(self)


DynamoHandler.call_action = _serial_call_action

if __name__ == "__main__":
    sys.exit(server.main())
