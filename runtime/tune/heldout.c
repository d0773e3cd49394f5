/*
 * heldout.c: the held-out text `khub tune` measures perplexity on: the
 * opening of Lewis Carroll, "Alice's Adventures in Wonderland" (1865),
 * chapter 1, as Project Gutenberg eBook #11 prints it (straight quotes).
 * Public domain (published 1865; the author died in 1898). It is not in
 * the workload, so it checks quality away from the prompts being tuned; a
 * text this famous is likely in a model's pretraining data, so only the
 * change against the baseline means anything, not the absolute value.
 */
#include "tune_impl.h"

const char khub__tune_heldout_source[] =
    "Lewis Carroll, Alice's Adventures in Wonderland (1865), chapter 1 opening; "
    "public domain (Project Gutenberg eBook #11)";

const char khub__tune_heldout_text[] =
    "Alice was beginning to get very tired of sitting by her sister on the bank, and of "
    "having nothing to do: once or twice she had peeped into the book her sister was reading,"
    " but it had no pictures or conversations in it, \"and what is the use of a book,\" thought"
    " Alice \"without pictures or conversations?\" So she was considering in her own mind (as "
    "well as she could, for the hot day made her feel very sleepy and stupid), whether the "
    "pleasure of making a daisy-chain would be worth the trouble of getting up and picking "
    "the daisies, when suddenly a White Rabbit with pink eyes ran close by her. There was "
    "nothing so very remarkable in that; nor did Alice think it so very much out of the way "
    "to hear the Rabbit say to itself, \"Oh dear! Oh dear! I shall be late!\"";
