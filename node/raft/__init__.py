"""raftq's fork of pysyncobj 0.3.17 (MIT, see LICENSE.txt): what changed and why is in FORK.md."""
from .syncobj import SyncObj, SyncObjException, SyncObjConf, replicated, replicated_sync,\
    FAIL_REASON, _COMMAND_TYPE, createJournal, HAS_CRYPTO, SERIALIZER_STATE, SyncObjConsumer, _RAFT_STATE, \
    StorageFailure
