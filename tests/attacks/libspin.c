/*
 * Review finding 6: a library the attacker's process runs in, later
 * unlinked and replaced by a FIFO of the same name.
 */
__attribute__((noinline)) void gs_attack_spin(void)
{
	for (volatile unsigned long i = 0; i < 2000000; i++)
		;
}
