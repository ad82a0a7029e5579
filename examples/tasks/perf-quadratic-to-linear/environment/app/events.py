"""Event-stream helpers used by the nightly import job."""


def dedupe(records):
    """Return records with duplicate "id" values removed.

    The first record for each id is kept and the original order is preserved.
    Ids are hashable values (ints or strings).
    """
    seen = []
    out = []
    for r in records:
        if r["id"] not in seen:
            seen.append(r["id"])
            out.append(r)
    return out


def pair_count(nums, target):
    """Number of index pairs (i, j) with i < j and nums[i] + nums[j] == target."""
    count = 0
    for i in range(len(nums)):
        for j in range(i + 1, len(nums)):
            if nums[i] + nums[j] == target:
                count += 1
    return count
