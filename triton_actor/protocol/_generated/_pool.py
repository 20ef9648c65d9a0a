"""Private descriptor pool of the generated modules (written by scripts/gen_protos.py; never edit).

Kept apart from protobuf's default pool so these modules can be imported in
the same process as tritonclient's own generated modules, which define the
same proto file names and symbols.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
