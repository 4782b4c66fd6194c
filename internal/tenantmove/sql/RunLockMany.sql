-- Lock runs $1 (those that still exist) for the rest of the transaction.
SELECT pk FROM runs WHERE pk = ANY ($1::bigint[]) ORDER BY pk FOR UPDATE
