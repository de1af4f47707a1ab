"""`python -m actstore.cli ...` is the `actstore` command."""

import sys

from actstore.cli import main

sys.exit(main())
