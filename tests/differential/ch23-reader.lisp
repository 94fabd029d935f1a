;;;; ch23-reader.lisp -- CLHS chapters 2 and 23, Syntax and the Reader: every case is one
;;;; top-level form, run in order in one world. Results are compared with SBCL's (see README.md).
; numbers
123
-45
+7
1.
-0
00012
1/2
4/2
-3/9
0/5
1.5
-1.5
.5
-.5
1.5e3
1.5d3
1.5E-3
1e0
1.0e10
123456789.0
1.0e-10
#b101
#B-101
#o777
#xabc
#XFF
#x1/2
#b101/11
#3r210
#16rFF
#2r1111
#36r10
; symbols and case
'abc
'ABC
'aBc
'|aBc|
'|a b c|
'a\ b
'\A
'|a|b|c|
'||
'1+
'+
'-
'a.b
'\1
'|1|
'1e
'1.2.3
'+.
'-.5x
(symbol-name 'abc)
(symbol-name '|abc|)
(symbol-name 'a|b c|d)
(symbol-name '\a\b)
(eq 'foo 'FOO)
(eq 'foo '|foo|)
:key
:KEY
(eq :a ':a)
(symbol-name :|lower|)
(keywordp :|x y|)
; characters
#\a
#\Z
#\space
#\SPACE
#\Newline
#\newline
#\tab
#\(
#\)
#\"
#\\
#\;
#\#
#\1
(char-code #\Nul)
(char-code #\Rubout)
(char-code #\Backspace)
(char-code #\Return)
(char-code #\Linefeed)
(char-code #\Page)
#\LATIN_SMALL_LETTER_A
(char-code #\U+3BB)
; strings
"abc"
"a\"b"
"a\\b"
"a\b"
"line1
line2"
(length "a\\b")
(length "tab	here")
; lists and dotted pairs
'(1 2 3)
'(1 . 2)
'(1 2 . 3)
'(1 . (2 3))
'(1 . (2 . (3 . nil)))
'()
'(())
'(nil)
'((a . b) (c . d))
'(a (b (c (d))))
'(quote x)
''x
'#'car
(car ''x)
(car '#'f)
; vectors and arrays
#(1 2 3)
#()
#(a #(b) "c")
(svref #(1 2 3) 1)
#2A((1 2) (3 4))
#0Aq
#1A(a b)
(aref #2A((1 2) (3 4)) 1 1)
(array-dimensions #2A((1 2 3) (4 5 6)))
(array-dimensions #3A(((1) (2)) ((3) (4))))
#3(a b)
#2(x)
(length #*110)
(aref #*101 2)
; comments and whitespace
(+ 1 ; comment
   2)
(+ 1 #| block |# 2)
(+ 1 #| nested #| block |# |# 3)
(list 1 #|x|#2)
'(a;comment
b)
; quote and backquote
(let ((x 1) (y '(2 3))) `(a ,x ,@y b))
(let ((x 1)) `(x ,x ,'x ,`x))
`(1 ,@nil 2)
`(1 . ,(+ 1 1))
`#(1 ,(+ 1 1))
(let ((l '(1 2))) `(,@l . 3))
(let ((l '(a b))) `((,@l) ,l))
(eval ``(list ,,(+ 1 2)))
`,5
`(,@'(1 2) ,@'(3))
; #' #: #. #+ errors and misc
(funcall #'(lambda (x) (* x x)) 3)
(symbol-package '#:foo)
(symbol-name '#:foo)
(eq '#:foo '#:foo)
(read-from-string "#:g")
(read-from-string "#.(+ 1 2)")
(read-from-string ")")
(read-from-string "(1 2")
(read-from-string "(1 . 2 3)")
(read-from-string "( . 1)")
(read-from-string "#<foo>")
(read-from-string "#z")
(read-from-string "\"abc")
(read-from-string "'")
(read-from-string "a:b:c")
(read-from-string "12345678901234567890")
(read-from-string "1/0")
(read-from-string "#xZZ")
(read-from-string ".")
(read-from-string "..")
(read-from-string "#\\Nosuchname")
(read-from-string "#*012")
(read-from-string "#3(1 2 3 4)")
(multiple-value-list (read-from-string "a b"))
(multiple-value-list (read-from-string "(a b)c"))
(multiple-value-list (read-from-string "  'x  "))
(multiple-value-list (read-from-string "; comment
 5"))
(multiple-value-list (read-from-string "#| c |# 6"))
(multiple-value-list (read-from-string "abc" t nil :start 1))
(multiple-value-list (read-from-string "abc def" t nil :end 2))
(multiple-value-list (read-from-string "   " nil 'none))
(read-from-string "#(1 #(2))")
(equal (read-from-string "(1 2 3)") '(1 2 3))
(let ((*read-base* 16)) (read-from-string "ff"))
(let ((*read-base* 2)) (read-from-string "101"))
(let ((*read-base* 16)) (read-from-string "1.5"))
(let ((*read-base* 16)) (read-from-string "10."))
(read-from-string "1.5l0")
(type-of (read-from-string "1.5d0"))
; the standard package prefixes name the standard symbols
(eq 'cl:car 'car)
(eq 'common-lisp::list 'list)
(cl:list 1 2)
(funcall #'cl:+ 1 2)
(eq 'cl-user::my-own-name 'my-own-name)
; feature expressions #+ and #- (CLHS 2.4.8.17, 2.4.8.18, 24.1.2.1)
(list 1 #+(or) 2 3)
(list 1 #-(or) 2 3)
(list 1 #+(and) 2 3)
(list 1 #-(and) 2 3)
(list #+common-lisp :cl #-common-lisp :other)
(list #+:ansi-cl 1 #-:ansi-cl 2)
(list #+(and common-lisp ansi-cl) 'both)
(list #+(or (and) (or)) 1 #+(and (and) (or)) 2)
(list #+(not (or)) 1 #-(not (or)) 2)
(list #+(:not (:and)) 1 #+(:or (:not (:or)) (:or)) 2)
(list #+(OR) 1 #+(And) 2)
(list #+(or) #+(or) 'a 'b 'c)
(list #+(and) #+(or) 'a 'b 'c)
(list #+(or) #+(and) 'a 'b 'c)
(list #-(or) #-(or) 1 2 3)
(list #+(or) #-(and) 'a 'b 'c)
(list '#+(or) a b)
(list #+ (or) a 'b)
(list #+(or) ; a comment between
  x 11)
(list #+(or) #| block |# x 12)
(list #+(or) (no-such-module:frob 1) 2)
(list #+(or) #z(1 2) 5)
(list #+(or) #.(error "never evaluated") 6)
(list #+(or) a:b:c 7)
(list #+(or) #\no-such-character-name 8)
(list #+(or) (1 . 2 3) 9)
(list #+(or) #1# 10)
(list #+(or) "a string" #+(or) #(1 2) #+(or) #'car 13)
(list #+(or) (a (b (c #+(and) d))) 14)
(vector #+(or) 1 2 #-(or) 3)
(cons 1 #+(or) 2 #+(and) 3)
(quote (a . #+(or) b c))
(multiple-value-list (read-from-string "#+(or) 1 2"))
(multiple-value-list (read-from-string "#-(or) 1 2"))
(multiple-value-list (read-from-string "(a #+(or) b c)"))
(multiple-value-list (read-from-string "#+(or) 1" nil :eof))
(multiple-value-list (read-from-string "#+(or) #+(or) 1 2 3"))
(read-from-string "#+(or) 1")
(read-from-string "#+")
(read-from-string "#-(and)")
(read-from-string "(a #+(and))")
(let ((*features* (cons :sexpgpu-test *features*))) (read-from-string "#+sexpgpu-test yes"))
(let ((*features* (cons :sexpgpu-test *features*))) (read-from-string "#-sexpgpu-test no yes"))
(let ((*features* '())) (multiple-value-list (read-from-string "#+common-lisp 1 2")))
(let ((*features* (list :my-feature))) (read-from-string "(#+my-feature 1 #-my-feature 2 #+(or my-feature other) 3 #+(and my-feature other) 4)"))
(let ((*features* (list :my-feature))) (read-from-string "(#+:my-feature 1 #+(:not :my-feature) 2 #+(not other) 3)"))
(let ((*features* (list :nil))) (read-from-string "(#+nil 1 #-nil 2)"))
(let ((*features* (list :my-feature))) (read-from-string "(#+(and) 1 #+(or) 2 #-(or) 3)"))
(not (null (member :common-lisp *features*)))
(not (null (member :ansi-cl *features*)))
(listp *features*)
(every #'keywordp *features*)
(let ((*features* (cons :pushed *features*))) (not (null (member :pushed *features*))))
