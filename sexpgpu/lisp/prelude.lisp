;;;; prelude.lisp -- loaded before every file.
;;;;
;;;; Everything here is written in SexpGPU Lisp over the evaluator's special forms and the
;;;; builtins. Names starting with % are internal: macros below expand into them, but user
;;;; files cannot see them.

;;; ------------------------------------------------------------------------------------------
;;; Definitions

(%defmacro defmacro (name lambda-list &body body)
  `(%defmacro ,name ,lambda-list ,@(%body-without-doc body)))

(%defun '%body-without-doc
  (lambda (body)
    (if (if (stringp (car body)) (cdr body) nil)
        (cdr body)
        body)))

(%defun '%split-body
  ;; (values declarations forms): the leading docstring is dropped, declarations kept apart
  (lambda (body)
    (let ((decls nil))
      (setq body (%body-without-doc body))
      (tagbody
       next
         (if (if (consp (car body)) (%name= (car (car body)) "DECLARE") nil)
             (progn (setq decls (cons (car body) decls))
                    (setq body (cdr body))
                    (go next))))
      (values (reverse decls) body))))

(defmacro defun (name lambda-list &body body)
  (multiple-value-call
      (lambda (decls forms)
        (if (consp name)
            `(%defsetf-function ',(car (cdr name))
                                (lambda ,lambda-list ,@decls (block ,(car (cdr name)) ,@forms)))
            `(%defun ',name (lambda ,lambda-list ,@decls (block ,name ,@forms)))))
    (%split-body body)))

(defmacro defvar (name &optional (value nil value-p) doc)
  (if value-p
      `(%defvar ',name (if (boundp ',name) (symbol-value ',name) ,value) nil)
      `(progn (%defvar ',name nil nil) ',name)))

(defmacro defparameter (name value &optional doc)
  `(%defvar ',name ,value t))

(defmacro defconstant (name value &optional doc)
  `(%defconstant ',name ,value))

;;; ------------------------------------------------------------------------------------------
;;; Control

(defmacro when (test &body body)
  `(if ,test (progn ,@body) nil))

(defmacro unless (test &body body)
  `(if ,test nil (progn ,@body)))

(defmacro and (&rest forms)
  (if (null forms)
      t
      (if (null (cdr forms))
          (car forms)
          `(if ,(car forms) (and ,@(cdr forms)) nil))))

(defmacro or (&rest forms)
  (if (null forms)
      nil
      (if (null (cdr forms))
          (car forms)
          (let ((g (gensym "OR")))
            `(let ((,g ,(car forms)))
               (if ,g ,g (or ,@(cdr forms))))))))

(defmacro cond (&rest clauses)
  (if (null clauses)
      nil
      (let ((clause (car clauses)))
        (if (null (cdr clause))
            (let ((g (gensym "COND")))
              `(let ((,g ,(car clause)))
                 (if ,g ,g (cond ,@(cdr clauses)))))
            `(if ,(car clause)
                 (progn ,@(cdr clause))
                 (cond ,@(cdr clauses)))))))

(defmacro return (&optional value)
  `(return-from nil ,value))

(defmacro prog1 (first &body body)
  (let ((g (gensym "PROG1")))
    `(let ((,g ,first)) ,@body ,g)))

(defmacro prog2 (first second &body body)
  `(progn ,first (prog1 ,second ,@body)))

(defmacro multiple-value-bind (vars form &body body)
  (let ((rest (gensym "REST")))
    `(multiple-value-call (lambda (&optional ,@vars &rest ,rest)
                            (declare (ignore ,rest))
                            ,@body)
       ,form)))

(defmacro multiple-value-list (form)
  `(multiple-value-call #'list ,form))

(defmacro multiple-value-setq (vars form)
  (let ((temps (%gensym-list (length vars))))
    `(multiple-value-bind ,temps ,form
       ,@(mapcar (lambda (v g) `(setq ,v ,g)) vars temps)
       ,(car temps))))

(defmacro nth-value (n form)
  `(nth ,n (multiple-value-list ,form)))

(defmacro psetq (&rest pairs)
  (let ((bindings nil) (sets nil))
    (tagbody
     next
       (if pairs
           (let ((g (gensym "PSETQ")))
             (setq bindings (cons (list g (car (cdr pairs))) bindings))
             (setq sets (cons `(setq ,(car pairs) ,g) sets))
             (setq pairs (cdr (cdr pairs)))
             (go next))))
    `(let ,(reverse bindings) ,@(reverse sets) nil)))

(defun %case-test (key keyform)
  (cond ((or (%name= key "OTHERWISE") (eq key t)) t)
        ((listp key) `(member ,keyform ',key))
        (t `(eql ,keyform ',key))))

(defmacro case (keyform &rest clauses)
  (let ((g (gensym "KEY")))
    `(let ((,g ,keyform))
       (cond ,@(mapcar (lambda (clause)
                         `(,(%case-test (car clause) g) nil ,@(cdr clause)))
                       clauses)))))

(defmacro ecase (keyform &rest clauses)
  (let ((g (gensym "KEY"))
        (keys (mapcan (lambda (c) (if (listp (car c)) (copy-list (car c)) (list (car c)))) clauses)))
    `(let ((,g ,keyform))
       (cond ,@(mapcar (lambda (clause)
                         `(,(%case-test (car clause) g) nil ,@(cdr clause)))
                       clauses)
             (t (error "~s fell through ecase: expected one of ~{~s~^, ~}" ,g ',keys))))))

(defmacro typecase (keyform &rest clauses)
  (let ((g (gensym "KEY")))
    `(let ((,g ,keyform))
       (cond ,@(mapcar (lambda (clause)
                         (if (or (%name= (car clause) "OTHERWISE") (eq (car clause) t))
                             `(t nil ,@(cdr clause))
                             `((typep ,g ',(car clause)) nil ,@(cdr clause))))
                       clauses)))))

(defmacro etypecase (keyform &rest clauses)
  (let ((g (gensym "KEY")))
    `(let ((,g ,keyform))
       (typecase ,g
         ,@clauses
         (otherwise (error "~s fell through etypecase: expected one of the types ~{~s~^, ~}"
                           ,g ',(mapcar #'car clauses)))))))

;;; ------------------------------------------------------------------------------------------
;;; Iteration

(defmacro dolist ((var list &optional result) &body body)
  ;; endp, not consp: a list form that is not a proper list is a type-error
  (let ((tail (gensym "TAIL")) (top (gensym "TOP")) (end (gensym "END")))
    (multiple-value-bind (decls forms) (%split-body body)
      `(block nil
         (let ((,tail ,list))
           (tagbody
            ,top
              (when (endp ,tail) (go ,end))
              (let ((,var (car ,tail)))
                ,@decls
                (tagbody ,@forms))
              (setq ,tail (cdr ,tail))
              (go ,top)
            ,end)
           (let ((,var nil))
             (declare (ignorable ,var))
             ,result))))))

(defmacro dotimes ((var count &optional result) &body body)
  (let ((n (gensym "N")) (top (gensym "TOP")) (end (gensym "END")))
    (multiple-value-bind (decls forms) (%split-body body)
      `(block nil
         (let ((,n ,count) (,var 0))
           ,@decls
           (unless (integerp ,n)
             (error 'type-error :datum ,n :expected-type 'integer))
           (tagbody
            ,top
              (when (>= ,var ,n) (go ,end))
              (tagbody ,@forms)
              (setq ,var (1+ ,var))
              (go ,top)
            ,end)
           ,result)))))

(defun %do-expansion (let-form set-form specs end-clause body)
  (let ((top (gensym "TOP"))
        (steps (mapcan (lambda (spec)
                         (if (and (consp spec) (cdr (cdr spec)))
                             (list (car spec) (car (cdr (cdr spec))))
                             nil))
                       specs)))
    (multiple-value-bind (decls forms) (%split-body body)
      `(block nil
         (,let-form ,(mapcar (lambda (spec)
                               (if (consp spec) (list (car spec) (car (cdr spec))) spec))
                             specs)
           ,@decls
           (tagbody
            ,top
              (if ,(car end-clause) (return-from nil (progn ,@(cdr end-clause))))
              (tagbody ,@forms)
              (,set-form ,@steps)
              (go ,top)))))))

(defmacro do (specs end-clause &body body)
  (%do-expansion 'let 'psetq specs end-clause body))

(defmacro do* (specs end-clause &body body)
  (%do-expansion 'let* 'setq specs end-clause body))

;;; ------------------------------------------------------------------------------------------
;;; Macro-writing helpers

(defmacro with-gensyms (names &body body)
  `(let ,(mapcar (lambda (n)
                   (if (consp n)
                       `(,(car n) (gensym ,(car (cdr n))))
                       `(,n (gensym ,(symbol-name n)))))
                 names)
     ,@body))

(defmacro once-only (names &body body)
  ;; each NAME is evaluated once, in order, by the expansion the body produces
  (let ((temps (mapcar (lambda (n) (gensym (symbol-name n))) names)))
    `(let ,(mapcar (lambda (g) `(,g (gensym "ONCE"))) temps)
       (list 'let
             (list ,@(mapcar (lambda (g n) `(list ,g ,n)) temps names))
             (let ,(mapcar (lambda (n g) `(,n ,g)) names temps)
               ,@body)))))

;;; ------------------------------------------------------------------------------------------
;;; Places: setf and friends

(defun %place-function-call-p (place)
  (and (consp place) (symbolp (car place))))

(defun %simple-setf (place value)
  ;; the store form for PLACE whose subforms are already evaluated (or pure)
  (if (symbolp place)
      `(setq ,place ,value)
      (let ((op (car place)) (args (cdr place)))
        (cond ((%name= op "CAR") `(%rplaca-value ,(car args) ,value))
              ((%name= op "FIRST") `(%rplaca-value ,(car args) ,value))
              ((%name= op "CDR") `(%rplacd-value ,(car args) ,value))
              ((%name= op "REST") `(%rplacd-value ,(car args) ,value))
              ((%name= op "NTH") `(%set-nth ,(car args) ,(car (cdr args)) ,value))
              ((%name= op "ELT") `(%set-elt ,(car args) ,(car (cdr args)) ,value))
              ((%name= op "AREF") `(%aset ,(car args) ,(car (cdr args)) ,value))
              ((%name= op "SVREF") `(%aset ,(car args) ,(car (cdr args)) ,value))
              ((%name= op "GETHASH") `(%puthash ,(car args) ,(car (cdr args)) ,value))
              ((%name= op "SYMBOL-VALUE") `(set ,(car args) ,value))
              ((%name= op "GETF")
               (let ((v (gensym "V")))
                 `(let ((,v ,value))
                    ,(%setf-1 (car args) `(%putf ,(car args) ,(car (cdr args)) ,v))
                    ,v)))
              ((%cxr-path op)
               (let ((path (%cxr-path op)))
                 (if (string= (subseq path 0 1) "A")
                     `(%rplaca-value ,(%cxr-form (subseq path 1) (car args)) ,value)
                     `(%rplacd-value ,(%cxr-form (subseq path 1) (car args)) ,value))))
              ((assoc (symbol-name op) '(("SECOND" . 1) ("THIRD" . 2) ("FOURTH" . 3) ("FIFTH" . 4)
                                         ("SIXTH" . 5) ("SEVENTH" . 6) ("EIGHTH" . 7) ("NINTH" . 8)
                                         ("TENTH" . 9))
                      :test #'string=)
               `(%set-nth ,(cdr (assoc (symbol-name op) '(("SECOND" . 1) ("THIRD" . 2) ("FOURTH" . 3)
                                                         ("FIFTH" . 4) ("SIXTH" . 5) ("SEVENTH" . 6)
                                                         ("EIGHTH" . 7) ("NINTH" . 8) ("TENTH" . 9))
                                       :test #'string=))
                          ,(car args) ,value))
              ((%macro-p op) (%setf-1 (macroexpand-1 place) value))
              (t `(funcall (%setf-function ',op) ,value ,@args))))))

(defun %cxr-path (op)
  ;; "AD" for CADR etc. (only for c[ad]{2,4}r), nil otherwise
  (let ((name (symbol-name op)))
    (if (and (> (length name) 3) (< (length name) 7)
             (string= (subseq name 0 1) "C")
             (string= (subseq name (1- (length name))) "R")
             (every (lambda (c) (or (char= c #\A) (char= c #\D)))
                    (subseq name 1 (1- (length name)))))
        (subseq name 1 (1- (length name)))
        nil)))

(defun %cxr-form (path form)
  (if (= (length path) 0)
      form
      (list (if (string= (subseq path 0 1) "A") 'car 'cdr)
            (%cxr-form (subseq path 1) form))))

(defun %setf-1 (place value)
  (%simple-setf place value))

(defmacro setf (&rest pairs)
  (if (oddp (length pairs))
      (error "setf needs an even number of arguments: (setf place value ...)"))
  (if (and pairs (null (cdr (cdr pairs))))
      (%setf-1 (car pairs) (car (cdr pairs)))
      (let ((forms nil))
        (tagbody
         next
           (if pairs
               (progn (setq forms (cons (%setf-1 (car pairs) (car (cdr pairs))) forms))
                      (setq pairs (cdr (cdr pairs)))
                      (go next))))
        `(progn ,@(reverse forms)))))

(defun %place-bindings (place)
  ;; (values bindings access-form): subforms of PLACE evaluated once, into temporaries
  (cond ((symbolp place) (values nil place))
        ((and (consp place) (%macro-p (car place))
              (not (member (symbol-name (car place)) '("GETF") :test #'string=)))
         (%place-bindings (macroexpand-1 place)))
        ((and (consp place) (%name= (car place) "GETF"))
         (multiple-value-bind (inner-bindings inner-access) (%place-bindings (car (cdr place)))
           (let ((k (gensym "KEY")))
             (values (append inner-bindings (list (list k (car (cdr (cdr place))))))
                     `(getf ,inner-access ,k)))))
        (t (let ((temps (mapcar (lambda (a) (declare (ignore a)) (gensym "ARG")) (cdr place))))
             (values (mapcar #'list temps (cdr place))
                     (cons (car place) temps))))))

(defmacro %modify-place (place fn-form)
  ;; (setf PLACE (FN-FORM current)) with PLACE's subforms evaluated once
  (multiple-value-bind (bindings access) (%place-bindings place)
    `(let* ,bindings
       ,(%setf-1 access (funcall fn-form access)))))

(defmacro incf (place &optional (delta 1))
  (multiple-value-bind (bindings access) (%place-bindings place)
    `(let* ,bindings ,(%setf-1 access `(+ ,access ,delta)))))

(defmacro decf (place &optional (delta 1))
  (multiple-value-bind (bindings access) (%place-bindings place)
    `(let* ,bindings ,(%setf-1 access `(- ,access ,delta)))))

(defmacro push (item place)
  (let ((g (gensym "ITEM")))
    (multiple-value-bind (bindings access) (%place-bindings place)
      `(let* ((,g ,item) ,@bindings) ,(%setf-1 access `(cons ,g ,access))))))

(defmacro pushnew (item place &rest keys)
  (let ((g (gensym "ITEM")))
    (multiple-value-bind (bindings access) (%place-bindings place)
      `(let* ((,g ,item) ,@bindings) ,(%setf-1 access `(adjoin ,g ,access ,@keys))))))

(defmacro pop (place)
  (let ((g (gensym "HEAD")))
    (multiple-value-bind (bindings access) (%place-bindings place)
      `(let* (,@bindings (,g ,access))
         (prog1 (car ,g) ,(%setf-1 access `(cdr ,g)))))))

(defmacro psetf (&rest pairs)
  (let ((bindings nil) (sets nil))
    (tagbody
     next
       (if pairs
           (let ((g (gensym "PSETF")))
             (setq bindings (cons (list g (car (cdr pairs))) bindings))
             (setq sets (cons (%setf-1 (car pairs) g) sets))
             (setq pairs (cdr (cdr pairs)))
             (go next))))
    `(let ,(reverse bindings) ,@(reverse sets) nil)))

(defmacro rotatef (&rest places)
  (if (null (cdr places))
      nil
      (let ((temps (mapcar (lambda (p) (declare (ignore p)) (gensym "ROT")) places)))
        `(let ,(mapcar #'list temps places)
           ,@(mapcar (lambda (p g) (%setf-1 p g))
                     places
                     (append (cdr temps) (list (car temps))))
           nil))))

(defmacro remf (place indicator)
  `(setf ,place (%remf ,place ,indicator)))

;;; ------------------------------------------------------------------------------------------
;;; Conditions

(defmacro ignore-errors (&body body)
  (let ((c (gensym "CONDITION")))
    `(handler-case (progn ,@body)
       (error (,c) (values nil ,c)))))

(defmacro assert (test &optional places datum &rest args)
  (declare (ignore places))
  (if datum
      `(unless ,test (error ,datum ,@args))
      `(unless ,test (error "The assertion ~s failed." ',test))))

(defmacro check-type (place type &optional type-string)
  (let ((v (gensym "VALUE")))
    `(let ((,v ,place))
       (unless (typep ,v ',type)
         (error 'type-error
                :format-control "The value of ~s is ~s, which is not ~a."
                :format-arguments (list ',place ,v ,(or type-string (format nil "of type ~s" type)))
                :datum ,v :expected-type ',type))
       nil)))

;;; ------------------------------------------------------------------------------------------
;;; Structures

(defun %defstruct-option (options name default)
  (let ((entry (find-if (lambda (o) (and (consp o) (%name= (car o) name))) options)))
    (cond ((null entry) (if (find-if (lambda (o) (%name= o name)) options) default default))
          ((cdr entry) (car (cdr entry)))
          (t default))))

(defmacro defstruct (name-and-options &rest slot-specs)
  (let* ((name (if (consp name-and-options) (car name-and-options) name-and-options))
         (options (if (consp name-and-options) (cdr name-and-options) nil))
         (prefix (let ((conc (%defstruct-option options "CONC-NAME" :default)))
                   (cond ((eq conc :default) (concatenate 'string (symbol-name name) "-"))
                         ((null conc) "")
                         (t (string conc)))))
         (include (%defstruct-option options "INCLUDE" nil))
         (inherited (if include (%struct-slots-with-defaults include) nil))
         (specs (append inherited
                        (mapcar (lambda (s) (if (consp s) (list (car s) (car (cdr s))) (list s nil)))
                                (if (stringp (car slot-specs)) (cdr slot-specs) slot-specs))))
         (slots (mapcar #'car specs))
         (constructor (%defstruct-option options "CONSTRUCTOR"
                                         (intern (concatenate 'string "MAKE-" (symbol-name name)))))
         (predicate (%defstruct-option options "PREDICATE"
                                       (intern (concatenate 'string (symbol-name name) "-P"))))
         (copier (%defstruct-option options "COPIER"
                                    (intern (concatenate 'string "COPY-" (symbol-name name)))))
         (obj (gensym "OBJ"))
         (value (gensym "VALUE"))
         (index -1))
    `(progn
       (%defstruct ',name ',slots ',include)
       (%remember-struct-defaults ',name ',specs)
       ,@(if constructor
             `((defun ,constructor (&key ,@specs)
                 (%make-struct ',name ,@slots))))
       ,@(if predicate `((defun ,predicate (,obj) (%struct-p ,obj ',name))))
       ,@(if copier `((defun ,copier (,obj) (copy-structure ,obj))))
       ,@(mapcan (lambda (slot)
                   (setq index (1+ index))
                   (let ((accessor (intern (concatenate 'string prefix (symbol-name slot)))))
                     `((defun ,accessor (,obj) (%struct-ref ,obj ',name ,index))
                       (defun (setf ,accessor) (,value ,obj) (%struct-set ,obj ',name ,index ,value)))))
                 slots)
       ',name)))

(defvar *%struct-defaults* (make-hash-table :test 'eq))

(defun %remember-struct-defaults (name specs)
  (setf (gethash name *%struct-defaults*) specs)
  name)

(defun %struct-slots-with-defaults (name)
  (multiple-value-bind (specs found) (gethash name *%struct-defaults*)
    (unless found (error "defstruct: :include names ~s, which is not a structure" name))
    specs))

;;; ------------------------------------------------------------------------------------------
;;; Functions on functions, trees, declarations

(defmacro declaim (&rest specs)
  (declare (ignore specs))
  nil)

(defun subst (new old tree &key (test #'eql))
  (cond ((funcall test old tree) new)
        ((consp tree)
         (let ((car (subst new old (car tree) :test test))
               (cdr (subst new old (cdr tree) :test test)))
           (if (and (eq car (car tree)) (eq cdr (cdr tree))) tree (cons car cdr))))
        (t tree)))

(defun complement (fn)
  (lambda (&rest args) (not (apply fn args))))

(defun constantly (value)
  (lambda (&rest args) (declare (ignore args)) value))

;;; ------------------------------------------------------------------------------------------
;;; loop (CLHS 6.1): for/as (in, on, across, = [then], being the hash-keys/values of [using],
;;; from/upfrom/downfrom to/upto/below/downto/above by, joined by and), repeat, with [and],
;;; named, initially, finally, do, return, collect append nconc count sum maximize minimize
;;; [into] [type], when/if/unless [and] [else] [end] with it, while, until, always, never,
;;; thereis, loop-finish.
;;;
;;; The expansion:
;;;   (block NAME
;;;     (let* (BINDINGS)                 every variable, in the order of the clauses
;;;       (tagbody
;;;          INITIALLY FIRST             the initially forms, then each iteration clause's
;;;        NEXT                          first setting and termination test
;;;          BODY STEPS (go NEXT)        the main clauses, then each iteration clause's step
;;;        END                           and test (clauses joined by `and` in parallel)
;;;          FINALLY)
;;;       RESULT))

(defun %loop-error (control &rest args)
  (error 'program-error :format-control (concatenate 'string "loop: " control) :format-arguments args))

(defvar *%loop-keywords*
  '("FOR" "AS" "WITH" "AND" "REPEAT" "WHILE" "UNTIL" "ALWAYS" "NEVER" "THEREIS" "DO" "DOING" "RETURN"
    "COLLECT" "COLLECTING" "APPEND" "APPENDING" "NCONC" "NCONCING" "COUNT" "COUNTING" "SUM" "SUMMING"
    "MAXIMIZE" "MAXIMIZING" "MINIMIZE" "MINIMIZING" "WHEN" "IF" "UNLESS" "ELSE" "END" "INITIALLY"
    "FINALLY" "NAMED" "INTO"))

(defvar *%loop-simple-types*
  '("FIXNUM" "FLOAT" "T" "NIL" "INTEGER" "NUMBER" "REAL" "RATIONAL" "RATIO" "BIT" "DOUBLE-FLOAT"
    "SINGLE-FLOAT" "SHORT-FLOAT" "LONG-FLOAT" "CHARACTER" "SYMBOL" "STRING" "LIST" "CONS" "BOOLEAN"))

(defun %loop-type-default (type)
  ;; the value `with var TYPE` starts with when no form is given
  (let ((head (if (consp type) (car type) type)))
    (cond ((not (symbolp head)) nil)
          ((member (symbol-name head) '("FIXNUM" "INTEGER" "NUMBER" "REAL" "RATIONAL" "BIT" "BIGNUM"
                                        "UNSIGNED-BYTE" "SIGNED-BYTE" "MOD")
                   :test #'string=)
           0)
          ((member (symbol-name head) '("FLOAT" "DOUBLE-FLOAT" "SINGLE-FLOAT" "SHORT-FLOAT" "LONG-FLOAT")
                   :test #'string=)
           0.0)
          (t nil))))

(defun %loop-pattern-vars (pattern)
  (cond ((null pattern) nil)
        ((symbolp pattern) (list pattern))
        ((consp pattern) (append (%loop-pattern-vars (car pattern)) (%loop-pattern-vars (cdr pattern))))
        (t (%loop-error "~s is not a variable or a destructuring pattern" pattern))))

(defun %loop-destructure (pattern value)
  ;; setq forms giving the variables of PATTERN their parts of the form VALUE
  (cond ((null pattern) nil)
        ((symbolp pattern) (list `(setq ,pattern ,value)))
        (t (let ((g (gensym "D")))
             (list `(let ((,g ,value))
                      ,@(%loop-destructure (car pattern) `(car ,g))
                      ,@(%loop-destructure (cdr pattern) `(cdr ,g))))))))

(defun %loop-destructure-bindings (pattern value)
  ;; let* bindings giving the variables of PATTERN their parts of the form VALUE
  (cond ((null pattern) nil)
        ((symbolp pattern) (list (list pattern value)))
        (t (let ((g (gensym "D")))
             (cons (list g value)
                   (append (%loop-destructure-bindings (car pattern) `(car ,g))
                           (%loop-destructure-bindings (cdr pattern) `(cdr ,g))))))))

(defun %loop-setq (pairs)
  ;; one assignment form for PAIRS ((place value)...), in parallel when there are several
  (cond ((null pairs) nil)
        ((null (cdr pairs)) (list `(setq ,(car (car pairs)) ,(car (cdr (car pairs))))))
        (t (list `(psetq ,@(mapcan #'copy-list pairs))))))

(defmacro loop (&rest clauses)
  (if (every #'consp clauses)
      (let ((top (gensym "TOP")))
        `(block nil (tagbody ,top ,@clauses (go ,top))))
      (%loop-expand clauses)))

(defmacro loop-finish ()
  (%loop-error "loop-finish is only allowed inside a loop"))

(defun %loop-expand (clauses)
  (let ((name nil)
        (bindings nil)       ; let* bindings, reversed
        (seen nil)           ; variables of with and for clauses
        (initially nil)
        (firsts nil)         ; first settings and tests, reversed
        (body nil)           ; main clauses, reversed
        (steps nil)          ; steps and tests, reversed
        (finally nil)
        (accumulators nil)   ; (var class tail flag)
        (default-acc nil)    ; the accumulator of clauses without into
        (result-form nil)
        (next-tag (gensym "NEXT"))
        (end (gensym "END")))
    (labels ((peek () (car clauses))
             (next ()
               (when (null clauses) (%loop-error "the clauses end too early"))
               (pop clauses))
             (kw-p (&rest names) (and clauses (apply #'%loop-kw-p (peek) names)))
             (bind (var value) (push (list var value) bindings))
             (note-var (var)
               (when (or (member var seen) (assoc var accumulators))
                 (%loop-error "the variable ~s is bound twice" var))
               (push var seen))
             (note-pattern (pattern) (mapc #'note-var (%loop-pattern-vars pattern)))
             (compound-forms ()
               (let ((forms nil))
                 (loop (if (and clauses (consp (peek))) (push (next) forms) (return)))
                 (reverse forms)))
             (skip-type ()
               ;; an optional type after a variable: (of-type TYPE) or a simple type name
               (cond ((kw-p "OF-TYPE") (next) (next))
                     ((and clauses (or (null (peek)) (symbolp (peek)))
                           (member (if (peek) (symbol-name (peek)) "NIL") *%loop-simple-types* :test #'string=))
                      (next))
                     (t nil)))
             ;; -- accumulation ----------------------------------------------------------
             (accumulator (class into)
               (let ((entry (if into (assoc into accumulators) default-acc)))
                 (cond (entry
                        (unless (string= (car (cdr entry)) class)
                          (%loop-error "~s accumulates both ~a and ~a values" (or into 'the-result)
                                       (car (cdr entry)) class))
                        entry)
                       (t
                        (when (and into (member into seen))
                          (%loop-error "the variable ~s is bound twice" into))
                        (let* ((var (or into (gensym "RESULT")))
                               (new (list var class (gensym "TAIL") (gensym "FLAG"))))
                          (bind var (if (string= class "LIST") nil 0))
                          (cond ((string= class "LIST") (bind (car (cdr (cdr new))) nil))
                                ((string= class "MAX") (bind (car (cdr (cdr (cdr new)))) nil)))
                          (push new accumulators)
                          (unless into
                            (setq default-acc new)
                            (setq result-form var))
                          new)))))
             (accumulate (kind form into)
               (let* ((class (cond ((member kind '("COLLECT" "COLLECTING" "APPEND" "APPENDING" "NCONC" "NCONCING")
                                            :test #'string=)
                                    "LIST")
                                   ((member kind '("SUM" "SUMMING" "COUNT" "COUNTING") :test #'string=) "SUM")
                                   (t "MAX")))
                      (entry (accumulator class into))
                      (var (car entry))
                      (tail (car (cdr (cdr entry))))
                      (flag (car (cdr (cdr (cdr entry))))))
                 (cond ((member kind '("COLLECT" "COLLECTING") :test #'string=)
                        (let ((cell (gensym "CELL")))
                          `(let ((,cell (list ,form)))
                             (if ,tail (rplacd ,tail ,cell) (setq ,var ,cell))
                             (setq ,tail ,cell))))
                       ((member kind '("APPEND" "APPENDING" "NCONC" "NCONCING") :test #'string=)
                        (let ((new (gensym "NEW")))
                          `(let ((,new ,(if (member kind '("APPEND" "APPENDING") :test #'string=)
                                            `(copy-list ,form)
                                            form)))
                             (when (consp ,new)
                               (if ,tail (rplacd ,tail ,new) (setq ,var ,new))
                               (setq ,tail (last ,new))))))
                       ((member kind '("SUM" "SUMMING") :test #'string=) `(setq ,var (+ ,var ,form)))
                       ((member kind '("COUNT" "COUNTING") :test #'string=) `(when ,form (setq ,var (1+ ,var))))
                       (t
                        (let ((v (gensym "V"))
                              (test (if (member kind '("MAXIMIZE" "MAXIMIZING") :test #'string=) '> '<)))
                          `(let ((,v ,form))
                             (if ,flag
                                 (when (,test ,v ,var) (setq ,var ,v))
                                 (setq ,var ,v ,flag t))))))))
             ;; -- main clauses --------------------------------------------------------------
             (clause-form (it)
               ;; the form of an accumulation or return clause; `it` is the test's value
               (let ((form (next)))
                 (if (and it (%loop-kw-p form "IT")) (progn (setf (car it) t) (car (cdr it))) form)))
             (parse-selectable (it)
               (case (and clauses (%loop-keyword (peek)))
                 ((:collect :collecting :append :appending :nconc :nconcing :sum :summing
                   :count :counting :maximize :maximizing :minimize :minimizing)
                  (let* ((kind (symbol-name (next)))
                         (form (clause-form it))
                         (into (when (kw-p "INTO") (next) (next))))
                    (when (and into (not (and (symbolp into) into)))
                      (%loop-error "into needs a variable, got ~s" into))
                    (skip-type)
                    (accumulate kind form into)))
                 ((:do :doing)
                  (next)
                  (let ((forms (compound-forms)))
                    (unless forms (%loop-error "do needs at least one form"))
                    `(progn ,@forms)))
                 (:return (next) `(return-from ,name ,(clause-form it)))
                 ((:when :if) (next) (parse-conditional nil))
                 (:unless (next) (parse-conditional t))
                 (t (%loop-error "expected a clause such as collect, do, when or return, found ~s"
                                 (if clauses (peek) "the end")))))
             (parse-clause-group (it)
               (let ((forms (list (parse-selectable it))))
                 (loop (if (kw-p "AND") (progn (next) (push (parse-selectable nil) forms)) (return)))
                 (reverse forms)))
             (parse-conditional (negate)
               (let* ((test (next))
                      (it (list nil (gensym "IT")))
                      (then (parse-clause-group it))
                      (else (when (kw-p "ELSE") (next) (parse-clause-group nil))))
                 (when (kw-p "END") (next))
                 (let ((branch `(if ,(if (car it) (car (cdr it)) test)
                                    ,(if negate `(progn ,@else) `(progn ,@then))
                                    ,(if negate `(progn ,@then) `(progn ,@else)))))
                   (if (car it) `(let ((,(car (cdr it)) ,test)) ,branch) branch))))
             ;; -- iteration clauses -----------------------------------------------------------
             (emit-group (entries)
               ;; each entry: (first-advance first-tests first-sets step-advance step-tests step-sets)
               (flet ((part (n) (mapcan (lambda (e) (copy-list (nth n e))) entries)))
                 (dolist (f (append (%loop-setq (part 0)) (part 1) (part 2))) (push f firsts))
                 (dolist (f (append (%loop-setq (part 3)) (part 4) (part 5))) (push f steps))))
             (parse-for-group ()
               (let ((entries (list (parse-for))))
                 (loop (if (kw-p "AND") (progn (next) (push (parse-for) entries)) (return)))
                 (emit-group (reverse entries))))
             (end-test (test) `(when ,test (go ,end)))
             (parse-for ()
               (let ((pattern (next)))
                 (note-pattern pattern)
                 (skip-type)
                 (case (and clauses (%loop-keyword (peek)))
                   (:in (next) (for-in pattern))
                   (:on (next) (for-on pattern))
                   (:across (next) (for-across pattern))
                   (:= (next) (for-equals pattern))
                   (:being (next) (for-being pattern))
                   ((:from :upfrom :downfrom :to :upto :below :downto :above :by)
                    (unless (and pattern (symbolp pattern))
                      (%loop-error "an arithmetic for needs a variable, got ~s" pattern))
                    (for-arithmetic pattern))
                   (t (%loop-error "unknown for clause after ~s: ~s" pattern (if clauses (peek) "the end"))))))
             (step-by (tail by) (if by `(funcall ,by ,tail) `(cdr ,tail)))
             (by-form ()
               (when (kw-p "BY")
                 (next)
                 (let ((g (gensym "BY"))) (bind g (next)) g)))
             (bind-pattern (pattern) (dolist (v (%loop-pattern-vars pattern)) (bind v nil)))
             (for-in (pattern)
               (let ((tail (gensym "LIST")))
                 (bind tail (next))
                 (let ((by (by-form))
                       (test (end-test `(endp ,tail)))
                       (sets (%loop-destructure pattern `(car ,tail))))
                   (bind-pattern pattern)
                   (list nil (list test) sets
                         (list (list tail (step-by tail by))) (list test) sets))))
             (for-on (pattern)
               (if (and pattern (symbolp pattern))
                   (progn
                     (bind pattern (next))
                     (let* ((by (by-form)) (test (end-test `(atom ,pattern))))
                       (list nil (list test) nil (list (list pattern (step-by pattern by))) (list test) nil)))
                   (let ((tail (gensym "LIST")))
                     (bind tail (next))
                     (let ((by (by-form))
                           (test (end-test `(atom ,tail)))
                           (sets (%loop-destructure pattern tail)))
                       (bind-pattern pattern)
                       (list nil (list test) sets (list (list tail (step-by tail by))) (list test) sets)))))
             (for-across (pattern)
               (let ((vec (gensym "VECTOR")) (index (gensym "INDEX")) (len (gensym "LENGTH")))
                 (bind vec (next))
                 (bind len `(length ,vec))
                 (bind index 0)
                 (bind-pattern pattern)
                 (let ((test (end-test `(>= ,index ,len)))
                       (sets (%loop-destructure pattern `(aref ,vec ,index))))
                   (list nil (list test) sets (list (list index `(1+ ,index))) (list test) sets))))
             (for-equals (pattern)
               (let* ((init (next))
                      (then (if (kw-p "THEN") (progn (next) (next)) init)))
                 (bind-pattern pattern)
                 (if (and pattern (symbolp pattern))
                     (list (list (list pattern init)) nil nil (list (list pattern then)) nil nil)
                     (let ((g (gensym "VALUE")))
                       (bind g nil)
                       (list (list (list g init)) nil (%loop-destructure pattern g)
                             (list (list g then)) nil (%loop-destructure pattern g))))))
             (for-being (pattern)
               (unless (kw-p "THE" "EACH")
                 (%loop-error "expected the or each after being, found ~s" (if clauses (peek) "the end")))
               (next)
               (unless (kw-p "HASH-KEY" "HASH-KEYS" "HASH-VALUE" "HASH-VALUES")
                 (%loop-error "SexpGPU's loop iterates with being only over hash-keys or hash-values, found ~s"
                              (if clauses (peek) "the end")))
               (let* ((keys-p (kw-p "HASH-KEY" "HASH-KEYS"))
                      (entries (gensym "ENTRIES"))
                      (other nil))
                 (next)
                 (unless (kw-p "OF" "IN") (%loop-error "expected of or in, found ~s" (if clauses (peek) "the end")))
                 (next)
                 (bind entries `(%hash-entries ,(next)))
                 (when (kw-p "USING")
                   (next)
                   (let ((spec (next)))
                     (unless (and (consp spec) (consp (cdr spec)))
                       (%loop-error "using needs (hash-value var) or (hash-key var), got ~s" spec))
                     (setq other (car (cdr spec)))
                     (note-var other)))
                 (bind-pattern pattern)
                 (when other (bind other nil))
                 (let ((test (end-test `(endp ,entries)))
                       (sets (append (%loop-destructure pattern (if keys-p `(car (car ,entries)) `(cdr (car ,entries))))
                                     (if other
                                         (list `(setq ,other ,(if keys-p `(cdr (car ,entries)) `(car (car ,entries)))))
                                         nil))))
                   (list nil (list test) sets (list (list entries `(cdr ,entries))) (list test) sets))))
             (for-arithmetic (var)
               ;; the from, to and by forms are evaluated once each, in the order written
               (let ((start nil) (start-kind nil) (limit nil) (limit-kind nil) (by 1) (order nil))
                 (loop
                   (cond ((kw-p "FROM" "UPFROM" "DOWNFROM")
                          (when start-kind (%loop-error "~s has two starting values" var))
                          (setq start-kind (symbol-name (next)) start (next))
                          (push :start order))
                         ((kw-p "TO" "UPTO" "BELOW" "DOWNTO" "ABOVE")
                          (when limit-kind (%loop-error "~s has two limits" var))
                          (setq limit-kind (symbol-name (next)) limit (next))
                          (push :limit order))
                         ((kw-p "BY")
                          (when (member :by order) (%loop-error "~s has two by values" var))
                          (next)
                          (setq by (next))
                          (push :by order))
                         (t (return))))
                 (let ((down (or (equal start-kind "DOWNFROM") (member limit-kind '("DOWNTO" "ABOVE") :test #'equal)))
                       (up (or (equal start-kind "UPFROM") (member limit-kind '("UPTO" "BELOW") :test #'equal))))
                   (when (and down up) (%loop-error "~s both counts up and down" var))
                   (unless (member :start order) (bind var 0))
                   (dolist (part (reverse order))
                     (cond ((eq part :start) (bind var start))
                           ((eq part :limit)
                            (unless (numberp limit)
                              (let ((g (gensym "LIMIT"))) (bind g limit) (setq limit g))))
                           (t (unless (numberp by)
                                (let ((g (gensym "BY"))) (bind g by) (setq by g))))))
                   (let ((test (when limit-kind
                                 (list (end-test (list (cond ((member limit-kind '("BELOW" "ABOVE") :test #'equal)
                                                              (if down '<= '>=))
                                                             (down '<)
                                                             (t '>))
                                                       var limit))))))
                     (list nil test nil (list (list var (list (if down '- '+) var by))) test nil)))))
             (parse-repeat ()
               (let ((count (gensym "REPEAT")))
                 (bind count (next))
                 (let ((test (list (end-test `(<= ,count 0)))))
                   (emit-group (list (list nil test nil (list (list count `(1- ,count))) test nil))))))
             (parse-with ()
               (let ((specs nil))
                 (loop
                   (let* ((pattern (next))
                          (type (progn (note-pattern pattern)
                                       (cond ((kw-p "OF-TYPE") (next) (next))
                                             ((and clauses (symbolp (peek)) (peek)
                                                   (member (symbol-name (peek)) *%loop-simple-types* :test #'string=))
                                              (next))
                                             (t nil))))
                          (init (if (kw-p "=") (progn (next) (next)) (%loop-type-default type))))
                     (push (list pattern init) specs))
                   (if (kw-p "AND") (next) (return)))
                 (setq specs (reverse specs))
                 (if (null (cdr specs))
                     (dolist (b (%loop-destructure-bindings (car (car specs)) (car (cdr (car specs))))) (push b bindings))
                     ;; with ... and ...: every form first, then the bindings
                     (let ((temps (mapcar (lambda (s) (declare (ignore s)) (gensym "WITH")) specs)))
                       (mapc (lambda (g s) (bind g (car (cdr s)))) temps specs)
                       (mapc (lambda (g s) (dolist (b (%loop-destructure-bindings (car s) g)) (push b bindings)))
                             temps specs))))))
      (when (kw-p "NAMED") (next) (setq name (next)))
      (loop
        (when (null clauses) (return))
        (case (%loop-keyword (peek))
          ((:for :as) (next) (parse-for-group))
          (:with (next) (parse-with))
          (:repeat (next) (parse-repeat))
          (:while (next) (push (end-test `(not ,(next))) body))
          (:until (next) (push (end-test (next)) body))
          (:always
           (next)
           (push `(unless ,(next) (return-from ,name nil)) body)
           (unless default-acc (setq result-form t)))
          (:never
           (next)
           (push `(when ,(next) (return-from ,name nil)) body)
           (unless default-acc (setq result-form t)))
          (:thereis
           (next)
           (let ((v (gensym "V")))
             (push `(let ((,v ,(next))) (when ,v (return-from ,name ,v))) body)))
          (:initially (next) (setq initially (append initially (compound-forms))))
          (:finally (next) (setq finally (append finally (compound-forms))))
          (:named (%loop-error "named must be the first clause"))
          (t (push (parse-selectable nil) body))))
      (let ((expansion
              `(block ,name
                 (let* ,(reverse bindings)
                   (tagbody
                      ,@initially
                      ,@(reverse firsts)
                    ,next-tag
                      ,@(reverse body)
                      ,@(reverse steps)
                      (go ,next-tag)
                    ,end
                      ,@finally)
                   ,result-form))))
        (if (%tree-has-name (list body finally) "LOOP-FINISH")
            `(macrolet ((loop-finish () '(go ,end))) ,expansion)
            expansion)))))
